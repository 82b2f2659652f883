"""The split of the predictive entropy into its aleatoric part and the mutual information
(bnn_zoo.evaluation._metrics.entropy_parts), and their place among the classification
metrics."""

from __future__ import annotations

import math

import pytest
import torch

from bnn_zoo._core.predictive import CategoricalPredictive, GaussianMixturePredictive
from bnn_zoo.evaluation._metrics import classification_metrics, entropy_parts

F64 = torch.float64


def random_probs(samples: int, points: int, classes: int, seed: int = 0,
                 dtype: torch.dtype = F64) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(samples, points, classes, generator=g, dtype=F64)
    return logits.softmax(-1).to(dtype)


def entropy(p: list[float]) -> float:
    return -sum(q * math.log(q) for q in p if q > 0)


@pytest.mark.parametrize("with_logs", [False, True])
def test_parts_sum_to_the_entropy_and_aleatoric_is_the_mean_sample_entropy(with_logs):
    probs = random_probs(5, 7, 4)
    pred = CategoricalPredictive(probs, probs.log() if with_logs else None)
    parts = entropy_parts(pred)
    torch.testing.assert_close(parts["aleatoric"] + parts["mi"], parts["entropy"],
                               rtol=1e-14, atol=0)
    torch.testing.assert_close(parts["entropy"], pred.entropy, rtol=0, atol=0)
    by_hand = [sum(entropy(probs[s, n].tolist()) for s in range(5)) / 5 for n in range(7)]
    torch.testing.assert_close(parts["aleatoric"], torch.tensor(by_hand, dtype=F64),
                               rtol=1e-12, atol=0)
    assert (parts["mi"] > 0.01).all()  # samples that disagree carry epistemic entropy


def test_mutual_information_of_two_samples_is_their_mean_kl_to_the_mixture():
    # I(y; w) = 1/S sum_s KL(p_s || p_mean): p_1 = (0.9, 0.1), p_2 = (0.5, 0.5), p_mean =
    # (0.7, 0.3); and two samples sure of opposite classes carry log 2 nats, all epistemic.
    probs = torch.tensor([[[0.9, 0.1], [1.0, 0.0]], [[0.5, 0.5], [0.0, 1.0]]], dtype=F64)
    parts = entropy_parts(CategoricalPredictive(probs))
    mean = [0.7, 0.3]
    kl = [sum(a * math.log(a / m) for a, m in zip(p, mean)) for p in ([0.9, 0.1], [0.5, 0.5])]
    assert parts["mi"][0].item() == pytest.approx(sum(kl) / 2, rel=1e-12)
    assert parts["mi"][0].item() == pytest.approx(0.10174922507919670, rel=1e-12)
    assert parts["aleatoric"][0].item() == pytest.approx(
        (entropy([0.9, 0.1]) + math.log(2)) / 2, rel=1e-12)
    assert parts["mi"][1].item() == pytest.approx(math.log(2), rel=1e-12)
    assert parts["aleatoric"][1].item() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_identical_samples_have_no_mutual_information(dtype):
    one = random_probs(1, 50, 3, seed=1, dtype=dtype)
    pred = CategoricalPredictive(one.expand(6, 50, 3).clone())
    # exactly none, with or without the samples' logarithms, however many of them
    for samples in (pred.probs, one):
        for logs in (None, samples.log()):
            parts = entropy_parts(CategoricalPredictive(samples, logs))
            assert torch.equal(parts["mi"], torch.zeros_like(parts["mi"]))
            assert torch.equal(parts["aleatoric"], parts["entropy"])


def test_mutual_information_is_never_negative_even_where_rounding_would_make_it_so():
    # Nearly identical float32 samples: their mean divergence from the average, 1/S sum_s
    # KL(p_s || p_mean), is rounding noise of either sign; the mutual information is
    # clipped at 0 and the parts still sum.
    base = random_probs(1, 500, 10, seed=2, dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    noisy = (base.log() + 1e-7 * torch.randn(8, 500, 10, generator=g)).softmax(-1)
    top = noisy.log().amax(0)
    log_mean = top + (noisy.log() - top).exp().mean(0).log()
    raw = (noisy * (noisy.log() - log_mean)).sum(-1).mean(0)
    assert (raw < 0).any()  # the unclipped divergence does go below zero here
    parts = entropy_parts(CategoricalPredictive(noisy))
    assert (parts["mi"] >= 0).all()
    torch.testing.assert_close(parts["aleatoric"] + parts["mi"], parts["entropy"])
    wide = entropy_parts(CategoricalPredictive(random_probs(20, 500, 10, seed=4)))
    assert (wide["mi"] >= 0).all()


def test_classification_metrics_report_the_mean_parts():
    probs = random_probs(4, 9, 3, seed=5)
    y = torch.arange(9) % 3
    got = classification_metrics(CategoricalPredictive(probs), y)
    parts = entropy_parts(CategoricalPredictive(probs))
    for name in ("entropy", "aleatoric", "mi"):
        assert got[name] == pytest.approx(float(parts[name].mean()), rel=1e-12)
    assert got["aleatoric"] + got["mi"] == pytest.approx(got["entropy"], rel=1e-12)


def test_entropy_parts_refuse_a_regression_predictive():
    pred = GaussianMixturePredictive(torch.zeros(2, 3), torch.ones(2, 3))
    with pytest.raises(TypeError, match="pred to be a CategoricalPredictive"):
        entropy_parts(pred)
