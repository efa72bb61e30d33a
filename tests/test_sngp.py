"""SNGP baseline: spectral-norm bound, random Fourier features of the RBF kernel, and the Laplace
posterior over the random-feature layer with the prior's precision (Liu et al., NeurIPS 2020)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics.pairwise import rbf_kernel
from torch.nn.utils import parametrize

from probtrans.errors import ConfigError
from probtrans.gp.sngp import RandomFeatures, SpectralNormBound, spectral_normalise
from probtrans.inference.laplace import LastLayerLaplace
from probtrans.resolve import load_model_spec
from tests.conftest import TINY_MODEL, inference_file, tiny_inference


def test_random_features_approximate_the_rbf_kernel():
    torch.manual_seed(0)
    lengthscale = 1.5
    x, y = torch.randn(20, 5), torch.randn(30, 5)
    features = RandomFeatures(5, n_features=40_000, lengthscale=lengthscale)
    approximate = (features(x) @ features(y).T).numpy()
    exact = rbf_kernel(x.numpy(), y.numpy(), gamma=1 / (2 * lengthscale**2))
    # Monte Carlo error of an average of M terms bounded by 2/M each: ~ 1/sqrt(M)
    np.testing.assert_allclose(approximate, exact, atol=0.03)
    assert features(x).shape == (20, 40_000)


def test_spectral_norm_bound_scales_only_large_weights(device):
    torch.manual_seed(0)
    layer = torch.nn.Linear(6, 8, device=device)
    spectral_normalise(layer, bound=0.9)  # its u and v on the weight's device
    with torch.no_grad():
        layer.parametrizations.weight.original.mul_(5.0)
    for _ in range(30):  # training-mode passes advance the power iteration
        layer(torch.randn(3, 6, device=device))
    assert torch.linalg.matrix_norm(layer.weight, ord=2).item() == pytest.approx(0.9, rel=1e-4)

    small = torch.randn(8, 6, device=device)
    small = 0.5 * small / torch.linalg.matrix_norm(small, ord=2)
    bound = SpectralNormBound(small, bound=0.9)
    torch.testing.assert_close(bound(small), small)  # σ = 0.5 ≤ c: left as it is

    layer.eval()  # evaluation does not move the estimate, and gradients reach the weight
    before = layer.parametrizations.weight[0].u.clone()
    layer(torch.randn(3, 6, device=device)).sum().backward()
    torch.testing.assert_close(layer.parametrizations.weight[0].u, before)
    assert layer.parametrizations.weight.original.grad.abs().sum() > 0
    assert parametrize.is_parametrized(layer, "weight")


SNGP_MODEL = TINY_MODEL.replace(
    "[model.attention]",
    'spectral_norm = 0.95\n\n[model.head]\nkind = "random_features"\nfeatures = 128\n'
    "lengthscale = 2.0\n\n[model.attention]",
)


def test_sngp_run_uses_the_prior_precision_and_bounded_encoder(tmp_path, monkeypatch, device):
    from probtrans.runs import fit, load_run
    from probtrans.runs.evaluation import split_predictives

    model = tmp_path / "sngp.toml"
    model.write_text(SNGP_MODEL)
    text = tiny_inference(tmp_path, "map").read_text()
    text += 'posthoc = ["laplace"]\nlaplace_prior_precision = 1.0\n'
    inference = inference_file(tmp_path, "sngp_map.toml", text)
    fit(model, inference, out=tmp_path / "run", progress=False)

    def refuse(*args, **kwargs):
        raise AssertionError("SNGP keeps its prior precision; nothing is fitted on validation")

    monkeypatch.setattr(LastLayerLaplace, "fit_prior_precision", refuse)
    run = load_run(tmp_path / "run", device)  # u, v buffers and the feature map come back
    probs, _, _, _ = split_predictives(run, run.posterior_samples(3), 3, device)
    assert probs["laplace"]["test"].shape == (3, len(run.data.test), run.data.n_classes)
    assert run.classifier.head.in_features == 128
    for module in run.classifier.encoder.layers.modules():
        if isinstance(module, torch.nn.Linear):
            assert torch.linalg.matrix_norm(module.weight, ord=2) <= 0.95 * 1.02


def test_sngp_spec_errors_name_the_field(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text(SNGP_MODEL.replace('weights = "last_layer"', 'weights = "all"'))
    with pytest.raises(ConfigError, match="model.spectral_norm = 0.95: needs model.prior"):
        load_model_spec(bad)
    bad.write_text(SNGP_MODEL.replace("features = 128", "features = 0"))
    with pytest.raises(ConfigError, match="model.head.features = 0"):
        load_model_spec(bad)


def test_the_median_heuristic_is_the_median_pairwise_distance():
    from scipy.spatial.distance import pdist

    from probtrans.gp.kernels import median_distance

    features = torch.randn(31, 7, generator=torch.Generator().manual_seed(3))
    assert median_distance(features) == pytest.approx(float(np.median(pdist(features.numpy()))))


def test_a_checkpoint_without_the_lengthscale_keeps_the_one_built():
    """Checkpoints written before ℓ was a buffer load with the ℓ of the spec."""
    features = RandomFeatures(4, 8, lengthscale=2.5)
    state = {k: v for k, v in features.state_dict().items() if k != "lengthscale"}
    rebuilt = RandomFeatures(4, 8, lengthscale=2.5)
    rebuilt.load_state_dict(state)
    assert float(rebuilt.lengthscale) == 2.5
    torch.testing.assert_close(rebuilt.omega, features.omega)
