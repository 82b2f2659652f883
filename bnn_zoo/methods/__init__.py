"""Inference methods (layer 3), each a frozen dataclass behind the protocol of
[`bnn_zoo.methods.base`][]: fit on standardised data, return a posterior that predicts.

[`svi`][bnn_zoo.methods.svi] (``SVI``), [`nuts`][bnn_zoo.methods.nuts] (``NUTS``),
[`sgmcmc`][bnn_zoo.methods.sgmcmc] (``SGMCMC``, SGLD and SGHMC),
[`ensemble`][bnn_zoo.methods.ensemble] (``Ensemble``), [`gp`][bnn_zoo.methods.gp] (``ExactGP``),
[`logitnormal`][bnn_zoo.methods.logitnormal] (``LogitNormalSVI``).
"""

__all__ = ["base", "ensemble", "gp", "logitnormal", "nuts", "sgmcmc", "svi"]
