"""Pyro effect handlers of the zoo: minibatches, KL weights and local reparameterisation.

Each is a `Messenger` that an objective or the SVI
runner installs around a model (and guide) run; models and guides know nothing of
them.

* [`subsample_data`][] sets the subsample indices of ``pyro.plate("data", N)``,
  so Pyro rescales the likelihood by ``N / B`` and a minibatch ELBO is an unbiased
  estimate of the full-batch ELBO.
* [`weight_points`][] weights the log density of each point of a minibatch (a padded
  short minibatch keeps one shape).
* [`scale_global_sites`][] multiplies the log density of every site outside the
  data plate (the KL weighting of Blundell et al. 2015, section 3.4).
* [`local_reparameterization`][] evaluates every affine layer
  (`bnn_zoo._core.nn.affine`) and every ``nn.Linear`` / ``nn.Conv{1,2,3}d`` of a
  [`BayesianModule`][bnn_zoo.models.BayesianModule] whose weight and bias were drawn from Gaussian
  guide sites by sampling the pre-activations from their Gaussian (Kingma, Salimans
  & Welling 2015), the idea of TyXe's local reparameterisation messenger;
  [`flipout`][] evaluates the same layers by flipout (Wen et al. 2018).
* [`check_observed_shapes`][] refuses an observed value whose shape differs from
  its distribution's, which Pyro would broadcast silently (``y`` of shape (N, 1)
  against a likelihood of shape (N,) gives an N x N log-likelihood).
"""

from __future__ import annotations

from collections.abc import Mapping

from pyro.poutine.messenger import Messenger
from pyro.poutine.subsample_messenger import _Subsample
from torch import Tensor

from bnn_zoo._core.nn import (
    NOISY_LAYER_TYPES,
    NoisyLayer,
    flipout_affine,
    flipout_noise,
    local_reparameterization_noise,
    local_reparameterized_affine,
)

__all__ = ["check_observed_shapes", "flipout", "local_reparameterization", "scale_global_sites",
           "subsample_data", "weight_points"]

#: The plate Pyro's ELBOs add for vectorised particles: its dimension is not part of the data.
_PARTICLE_PLATE = "num_particles_vectorized"


def _in_plate(msg: dict, name: str) -> bool:
    return any(frame.name == name for frame in msg["cond_indep_stack"])


class subsample_data(Messenger):
    """Effect handler that sets the subsample indices of ``pyro.plate(name, N)``.

    Applied to model and guide alike, so both see the same minibatch. ``scale``
    multiplies the log density of every site inside the plate: in data-parallel
    training the plate holds this process's shard of ``n`` rows while the ELBO is
    that of all ``N`` rows, so ``scale = N / n`` (see `bnn_zoo._core.distributed`).
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


class weight_points(Messenger):
    """Multiply the log density of every sample site in the plate ``plate`` (the data plate
    by default) by a weight per member: ``weights`` (one per index of the plate), laid
    along the plate's dimension.

    `SVIStep` pads an epoch's short last minibatch to the
    batch size with weight-zero points and weights ``B / b`` on its ``b`` real ones, so
    every minibatch has one shape (one traced loss, not two) and the same value; replicas
    read their losses through weights on the replica plate
    (`weight_replicas`).
    """

    def __init__(self, weights: Tensor, plate: str = "data") -> None:
        super().__init__()
        self.weights = weights
        self.plate = plate

    def _pyro_sample(self, msg) -> None:
        if isinstance(msg["fn"], _Subsample):
            return
        for frame in msg["cond_indep_stack"]:
            if frame.name == self.plate:
                shape = (-1,) + (1,) * (-frame.dim - 1)
                msg["scale"] = msg["scale"] * self.weights.reshape(shape)


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


def _drop_constant_dims(t: Tensor, event_dim: int) -> Tensor:
    """``t`` without the leading sample dimensions along which it does not vary (size one,
    or stride zero: Pyro expands a guide's moments over the particles), so that moments
    shared by all weight samples are computed with once, not once per sample."""
    while t.dim() > event_dim and (t.shape[0] == 1 or t.stride(0) == 0):
        t = t[0]
    return t


class _GaussianLayers(Messenger):
    """Base of the handlers that evaluate layers whose weights come from Gaussian guide sites.

    ``moments`` maps a sample site name to the ``(loc, scale)`` of its Gaussian guide
    distribution (each broadcastable to the site's value). While the handler is active, the
    model's draw at such a site is remembered; a layer whose weight and bias (or weight
    alone, for a torch layer without bias) are such draws, or views of them (a singleton
    plate dim squeezed), is evaluated by the subclass's estimator:

    * an affine layer ``h @ W + b`` of the zoo's MLPs (`bnn_zoo._core.nn.affine`), by
      `_affine`;
    * an ``nn.Linear`` or ``nn.Conv{1,2,3}d`` of a wrapped torch module
      (`bnn_zoo._core.nn.noisy_layer`, sent by [`BayesianModule`][bnn_zoo.models.BayesianModule]),
      by `_noisy_layer`.

    Every other layer is computed as usual with the sampled weights; the weight draws still
    enter the model's trace, so the KL terms are those of the plain objective.

    .. warning:: A torch layer's estimator acts in its ``forward`` (a forward hook adds the
        noise to ``layer(x; mean)``). A module that uses such a layer's tensors outside its
        forward (``layer.weight`` read directly, as ``nn.MultiheadAttention`` does with its
        ``out_proj``, whose type, a ``Linear`` subclass, is therefore left alone) would see
        the mean without noise; and a layer called twice per data point, or whose weight is
        tied to another's, gets independent noise at each call.
    """

    def __init__(self, moments: Mapping[str, tuple[Tensor, Tensor]]) -> None:
        super().__init__()
        if not isinstance(moments, Mapping):
            raise TypeError(f"Expected moments to be a mapping of site names to (loc, scale) "
                            f"pairs of tensors, but got {type(moments).__name__}.")
        for name, pair in moments.items():
            if not (isinstance(pair, (tuple, list)) and len(pair) == 2
                    and all(isinstance(t, Tensor) for t in pair)):
                raise TypeError(f"Expected moments[{name!r}] to be a (loc, scale) pair of "
                                f"tensors, but got {pair!r}.")
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
            try:
                # (no op where the shapes agree: a traced loss would keep it every step)
                expanded = tuple(t if t.shape == value.shape else t.expand(value.shape)
                                 for t in pair)
            except RuntimeError:
                raise ValueError(
                    f"Expected the moments of site {msg['name']!r} to broadcast to the shape "
                    f"{tuple(value.shape)} of its value, but got loc {tuple(pair[0].shape)} and "
                    f"scale {tuple(pair[1].shape)}.") from None
            self._draws.append((value, expanded))

    def _moments_of(self, value: Tensor) -> tuple[Tensor, Tensor] | None:
        for draw, (loc, scale) in self._draws:
            if value is draw or value._base is draw:
                if loc.shape == value.shape and scale.shape == value.shape:
                    return loc, scale
                return loc.reshape(value.shape), scale.reshape(value.shape)
        return None

    def _pyro_affine(self, msg) -> None:
        h, weight, bias = msg["args"]
        weight_moments, bias_moments = self._moments_of(weight), self._moments_of(bias)
        if weight_moments is not None and bias_moments is not None:
            msg["value"] = self._affine(h, (weight, *weight_moments), (bias, *bias_moments))
            msg["done"] = True

    def _pyro_noisy_layer(self, msg) -> None:
        layer, params = msg["args"]
        names = {"weight"} if getattr(layer, "bias", None) is None else {"weight", "bias"}
        # The exact types: a subclass may compute something else in its forward.
        if type(layer) not in NOISY_LAYER_TYPES or set(params) != names:
            return
        moments = {name: self._moments_of(value) for name, value in params.items()}
        if all(pair is not None for pair in moments.values()):
            event_dims = {name: getattr(layer, name).dim() for name in names}
            msg["value"] = self._noisy_layer(params, {
                name: tuple(_drop_constant_dims(t, event_dims[name]) for t in pair)
                for name, pair in moments.items()})
            msg["done"] = True

    def _affine(self, h: Tensor, weight: tuple[Tensor, Tensor, Tensor],
                bias: tuple[Tensor, Tensor, Tensor]) -> Tensor:
        """``h @ W + b`` by the estimator; ``weight`` and ``bias`` are (draw, loc, scale)."""
        raise NotImplementedError

    def _noisy_layer(self, params: dict[str, Tensor],
                     moments: dict[str, tuple[Tensor, Tensor]]) -> NoisyLayer:
        """The estimator for a torch layer with the draws ``params`` and their moments."""
        raise NotImplementedError


class local_reparameterization(_GaussianLayers):
    """Local reparameterisation trick for the layers of a model run (Kingma, Salimans &
    Welling 2015), the idea of TyXe's local reparameterisation messenger.

    ``moments`` maps a sample site name to the ``(loc, scale)`` of its Gaussian guide
    distribution (broadcastable to the site's value). A layer whose weight ``W ~ N(M, S^2)``
    and bias ``b ~ N(m, s^2)`` were drawn at such sites (see `_GaussianLayers` for
    which layers) ignores the draws and samples its outputs from their Gaussian given the
    layer input ``h``:

    .. math::

        \\mathrm{layer}(h; W, b) \\approx \\mathrm{layer}(h; M, m)
            + \\sqrt{\\mathrm{layer}(h^2; S^2, s^2)} \\odot \\epsilon,
        \\qquad \\epsilon \\sim N(0, I),

    a fresh ``epsilon`` per data point and output unit
    (`local_reparameterized_affine` for an affine layer ``h W + b``,
    `local_reparameterization_noise` for an ``nn.Linear`` or a
    convolution, with the layer's stride, padding, dilation and groups). For a fully
    connected layer each point's expected log-likelihood is unchanged and the gradient
    estimates have lower variance; the units of a convolution share weights across
    positions and get independent noise here, the usual approximation (each unit's
    marginal is exact; [`flipout`][] is unbiased for them). The weight draws still
    enter the model's trace, so the KL terms are those of the plain objective.
    """

    def _affine(self, h, weight, bias):
        return local_reparameterized_affine(h, weight[1:], bias[1:])

    def _noisy_layer(self, params, moments):
        return NoisyLayer(mean={name: loc for name, (loc, _) in moments.items()},
                          inputs={name: scale**2 for name, (_, scale) in moments.items()},
                          noise=local_reparameterization_noise)


class flipout(_GaussianLayers):
    """Flipout (Wen et al. 2018) for the layers of a model run.

    ``moments`` maps a sample site name to the ``(loc, scale)`` of its Gaussian guide
    distribution (broadcastable to the site's value; only ``loc`` is used). A layer whose
    weight ``W = M + dW`` and bias ``b = m + db`` were drawn at such sites (see
    `_GaussianLayers` for which layers) is evaluated as

    .. math::

        \\mathrm{layer}(h; M, m)
            + \\mathrm{layer}(h \\odot s_{in}; dW, db) \\odot s_{out},

    with random signs ``s_in``, ``s_out`` per data point and input or output unit (channel,
    for a convolution; `flipout_affine`,
    `flipout_noise`). Each point sees the weights
    ``M + dW * (s_out s_in^T)``, distributed as ``W`` for a diagonal Gaussian guide, so the
    objective and its expected gradient are those of weight sampling, and the weight noise
    of different points in a minibatch is decorrelated, which lowers the gradient variance.
    The weight draws enter the model's trace as usual, so the KL terms are unchanged.
    """

    def _affine(self, h, weight, bias):
        return flipout_affine(h, weight[:2], bias[:2])

    def _noisy_layer(self, params, moments):
        return NoisyLayer(mean={name: loc for name, (loc, _) in moments.items()},
                          inputs={name: params[name] - loc for name, (loc, _) in moments.items()},
                          noise=flipout_noise)


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
