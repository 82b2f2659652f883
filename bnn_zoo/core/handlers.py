"""Pyro effect handlers of the zoo: minibatches, KL weights and local reparameterisation.

Each is a :class:`~pyro.poutine.messenger.Messenger` that an objective or the SVI
runner installs around a model (and guide) run; models and guides know nothing of
them.

* :class:`subsample_data` sets the subsample indices of ``pyro.plate("data", N)``,
  so Pyro rescales the likelihood by ``N / B`` and a minibatch ELBO is an unbiased
  estimate of the full-batch ELBO.
* :class:`scale_global_sites` multiplies the log density of every site outside the
  data plate (the KL weighting of Blundell et al. 2015, section 3.4).
* :class:`local_reparameterization` evaluates every affine layer
  (:func:`bnn_zoo.core.nn.affine`) whose weight and bias were drawn from Gaussian
  guide sites by sampling the pre-activations from their Gaussian (Kingma, Salimans
  & Welling 2015), the idea of TyXe's local reparameterisation messenger.
* :class:`check_observed_shapes` refuses an observed value whose shape differs from
  its distribution's, which Pyro would broadcast silently (``y`` of shape (N, 1)
  against a likelihood of shape (N,) gives an N x N log-likelihood).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyro.poutine.messenger import Messenger
from pyro.poutine.subsample_messenger import _Subsample
from torch import Tensor

from bnn_zoo.core.nn import local_reparameterized_affine

__all__ = ["check_observed_shapes", "local_reparameterization", "scale_global_sites",
           "subsample_data"]

#: The plate Pyro's ELBOs add for vectorised particles: its dimension is not part of the data.
_PARTICLE_PLATE = "num_particles_vectorized"


def _in_plate(msg: dict, name: str) -> bool:
    return any(frame.name == name for frame in msg["cond_indep_stack"])


class subsample_data(Messenger):
    """Effect handler that sets the subsample indices of ``pyro.plate(name, N)``.

    Applied to model and guide alike, so both see the same minibatch. ``scale``
    multiplies the log density of every site inside the plate: in data-parallel
    training the plate holds this process's shard of ``n`` rows while the ELBO is
    that of all ``N`` rows, so ``scale = N / n`` (see :mod:`bnn_zoo.core.distributed`).
    """

    def __init__(self, indices: Tensor, name: str = "data", scale: float = 1.0) -> None:
        super().__init__()
        self.indices = indices
        self.name = name
        self.scale = scale

    def _pyro_sample(self, msg) -> None:
        if msg["name"] == self.name and isinstance(msg["fn"], _Subsample):
            msg["value"] = self.indices
            msg["done"] = True
        elif self.scale != 1.0 and _in_plate(msg, self.name):
            msg["scale"] = msg["scale"] * self.scale


class scale_global_sites(Messenger):
    """Multiply the log density of every sample site outside the data plate by ``weight``."""

    def __init__(self, weight: float, data_plate: str = "data") -> None:
        super().__init__()
        self.weight = weight
        self.data_plate = data_plate

    def _pyro_sample(self, msg) -> None:
        if isinstance(msg["fn"], _Subsample):
            return
        if not _in_plate(msg, self.data_plate):
            msg["scale"] = msg["scale"] * self.weight


class local_reparameterization(Messenger):
    """Local reparameterisation trick for the affine layers of a model run.

    ``moments`` maps a sample site name to the ``(loc, scale)`` of its Gaussian guide
    distribution (shaped like the site's value). While the handler is active, the
    model's draw at such a site is remembered; an affine layer ``h @ W + b``
    (:func:`bnn_zoo.core.nn.affine`, an effectful operation) whose ``W`` and ``b`` are
    both such draws (or views of them, e.g. with a singleton plate dim squeezed) is
    evaluated as

    .. math::

        h W + b \\approx h M + m + \\sqrt{h^2 S^2 + s^2} \\odot \\epsilon,
        \\qquad \\epsilon \\sim N(0, I),

    a fresh ``epsilon`` per data point (:func:`~bnn_zoo.core.nn.local_reparameterized_affine`),
    with ``W ~ N(M, S^2)``, ``b ~ N(m, s^2)``. Each point's expected log-likelihood is
    unchanged and the gradient estimates have lower variance. Layers with any other
    weights are computed as usual; the weight draws still enter the model's trace, so
    the KL terms are those of the plain objective.
    """

    def __init__(self, moments: Mapping[str, tuple[Tensor, Tensor]]) -> None:
        super().__init__()
        self.moments = dict(moments)
        self._draws: list[tuple[Tensor, tuple[Tensor, Tensor]]] = []

    def __enter__(self):
        self._draws = []
        return super().__enter__()

    def __exit__(self, *args):
        self._draws = []  # the draws of this run only; release them
        return super().__exit__(*args)

    def _pyro_post_sample(self, msg) -> None:
        pair = self.moments.get(msg["name"])
        if pair is not None and not msg["is_observed"]:
            value = msg["value"]
            self._draws.append((value, tuple(t.expand(value.shape) for t in pair)))

    def _moments_of(self, value: Tensor) -> tuple[Tensor, Tensor] | None:
        for draw, (loc, scale) in self._draws:
            if value is draw or value._base is draw:
                return loc.reshape(value.shape), scale.reshape(value.shape)
        return None

    def _pyro_affine(self, msg) -> None:
        h, weight, bias = msg["args"]
        weight_moments, bias_moments = self._moments_of(weight), self._moments_of(bias)
        if weight_moments is not None and bias_moments is not None:
            msg["value"] = local_reparameterized_affine(h, weight_moments, bias_moments)
            msg["done"] = True


class check_observed_shapes(Messenger):
    """Effect handler that raises a ``ValueError`` when the value observed at a sample
    site does not have the shape of the site's distribution (batch + event shape), or lies
    outside its support (class labels beyond the classes of a ``Categorical``).

    The distribution may have leading batch dimensions of its own that the value lacks:
    those of plates other than ``pyro.plate("data")`` (Pyro's vectorised particles, mixture
    components), or of size one; the value must match all the rest. The value observed at
    ``obs`` is called ``y`` in the message, the name users give it.
    """

    def _pyro_sample(self, msg) -> None:
        if (not msg["is_observed"] or msg["value"] is None
                or msg["infer"].get("_deterministic")):  # pyro.deterministic records a value
            return
        fn = msg["fn"]
        full = (*fn.batch_shape, *fn.event_shape)
        shape = tuple(msg["value"].shape)
        what = "y" if msg["name"] == "obs" else f"the value observed at {msg['name']!r}"
        event_dim = len(fn.event_shape)
        plate_dims = {frame.dim for frame in msg["cond_indep_stack"]
                      if frame.dim is not None and frame.name != "data"}
        # Leading dimensions the value may lack: size one, or those of a plate other than the
        # data plate (plate dimensions count from the right of the batch shape).
        extra = [p for p in range(-len(full), 0)
                 if full[p] == 1 or (p + event_dim < 0 and p + event_dim in plate_dims)]
        k = len(full)
        while k > 0 and -k in extra:
            k -= 1
        expected = full[len(full) - k:]
        if len(shape) > len(full) or full[len(full) - len(shape):] != shape \
                or any(p not in extra for p in range(-len(full), -len(shape))):
            raise ValueError(
                f"Expected {what} to have the shape {expected} of the likelihood at site "
                f"{msg['name']!r}, but got {shape}; Pyro would broadcast it silently. "
                "Pass targets of shape (N,) (reshape with y.reshape(-1)).")
        # A meta tensor has no values to check (it stands in for a device in tests).
        if not msg["value"].is_meta and not bool(fn.support.check(msg["value"]).all()):
            raise ValueError(f"Expected {what} within the support {fn.support} of the likelihood "
                             f"at site {msg['name']!r}, but some values lie outside it.")
