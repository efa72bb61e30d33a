"""Your own model in ArviZ (``probtrans.to_inference_data``) and the public metrics on arrays
(``probtrans.ece``, ``ood_detection``, ``ood_report``, ``heldout_elpd``)."""

from __future__ import annotations

import math
import random
import warnings

import matplotlib
import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample
from scipy.special import logsumexp

import probtrans
from probtrans.analysis.metrics import mutual_information
from probtrans.errors import ProbtransError
from probtrans.nn import HierarchicalStochasticAttention, StochasticAttention

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az

matplotlib.use("Agg")

SAMPLES = 12
N_TRAIN, N_TEST, N_CLASSES = 40, 20, 3


class SequenceClassifier(PyroModule):
    """The README's model, smaller: sequences (B, 5, 8) → 3 classes, H-STO and STO attention
    (local sites), a Bayesian read-out weight (the global site)."""

    def __init__(self, d_model: int = 8) -> None:
        super().__init__()
        self.attn1 = HierarchicalStochasticAttention(d_model=d_model, n_heads=2, n_centroids=3)
        self.attn2 = StochasticAttention(d_model=d_model, n_heads=2, tau=0.5)
        self.readout = PyroModule[torch.nn.Linear](d_model, N_CLASSES)
        self.readout.weight = PyroSample(
            dist.Normal(0.0, 1.0).expand([N_CLASSES, d_model]).to_event(2)
        )

    def forward(self, x, y=None):
        weight = self.readout.weight
        with pyro.plate("data", len(x)):
            h = x + self.attn1(x)
            h = h + self.attn2(h)
            logits = h.mean(1) @ weight.T + self.readout.bias
            return pyro.sample("y", dist.Categorical(logits=logits), obs=y)


@pytest.fixture(scope="module")
def fitted():
    """(model, guide, x, y) after 50 SVI steps on the first N_TRAIN examples."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x = torch.randn(N_TRAIN + N_TEST, 5, 8)
    y = (x[:, :, 0].mean(1) > 0).long() + (x[:, :, 1].mean(1) > 0.3).long()  # 3 classes
    model = SequenceClassifier()
    guide = AutoNormal(probtrans.self_guided(model))
    svi = SVI(probtrans.self_guided(model), guide, pyro.optim.Adam({"lr": 0.02}), Trace_ELBO())
    for _ in range(50):
        svi.step(x[:N_TRAIN], y[:N_TRAIN])
    yield model, guide, x, y
    pyro.clear_param_store()


def idata_of(fitted, **options):
    model, guide, x, y = fitted
    train, test = slice(0, N_TRAIN), slice(N_TRAIN, None)
    return probtrans.to_inference_data(
        model, guide, x[train], y[train], x[test], y[test], samples=SAMPLES, **options
    )


def test_the_groups_are_those_of_predictive_nc_with_the_guides_draws(fitted):
    model, guide, x, y = fitted
    states = (random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state())
    idata = idata_of(fitted, seed=3)
    assert random.getstate() == states[0]
    assert (np.random.get_state()[1] == states[1]).all()
    assert torch.equal(torch.get_rng_state(), states[2])
    assert set(idata.groups()) == {
        "posterior",
        "log_likelihood",
        "posterior_predictive",
        "observed_data",
    }
    assert list(idata.posterior.data_vars) == ["readout.weight"]  # not attention, not auxiliary
    for group in ("posterior", "log_likelihood", "posterior_predictive"):
        assert idata[group].sizes["chain"] == 1 and idata[group].sizes["draw"] == SAMPLES, group
    assert idata.log_likelihood["y_train"].shape == (1, SAMPLES, N_TRAIN)
    assert idata.posterior_predictive["y_train"].shape == (1, SAMPLES, N_TRAIN)
    assert idata.posterior_predictive["y_test"].shape == (1, SAMPLES, N_TEST)
    assert idata.posterior_predictive["log_lik_test"].shape == (1, SAMPLES, N_TEST)
    np.testing.assert_array_equal(idata.observed_data["y_train"], y[:N_TRAIN].numpy())
    np.testing.assert_array_equal(idata.observed_data["y_test"], y[N_TRAIN:].numpy())
    pyro.set_rng_seed(3)
    with torch.no_grad():
        draws = Predictive(guide, num_samples=SAMPLES)(x[:N_TRAIN], y[:N_TRAIN])
    np.testing.assert_array_equal(
        idata.posterior["readout.weight"].values[0], draws["readout.weight"].numpy()
    )
    drawn = idata.posterior_predictive["y_test"].values[0]  # (S, N): labels from the probs
    assert drawn.min() >= 0 and drawn.max() < N_CLASSES


@pytest.mark.parametrize("replicas", [1, 3])
def test_the_log_likelihood_is_the_models_for_each_draw(fitted, replicas):
    """Each draw's rows: the model conditioned by hand on that draw, the local randomness seeded
    as documented, Pyro's own log-density of the observed labels, averaged over the replicas."""
    model, _, x, y = fitted
    idata = idata_of(fitted, seed=5, replicas=replicas, batch_size=16)
    for s in (0, SAMPLES - 1):
        weight = torch.as_tensor(idata.posterior["readout.weight"].values[0, s])
        conditioned = poutine.condition(model, data={"readout.weight": weight})
        pyro.set_rng_seed(5)
        expected = {}
        for split, rows in (("train", slice(0, N_TRAIN)), ("test", slice(N_TRAIN, None))):
            passes = []
            for _ in range(replicas):
                parts = []
                for start in range(rows.start, rows.stop or len(x), 16):
                    batch = slice(start, min(start + 16, rows.stop or len(x)))
                    with torch.no_grad():
                        trace = poutine.trace(conditioned).get_trace(x[batch], y[batch])
                    trace.compute_log_prob()
                    parts.append(trace.nodes["y"]["log_prob"].double().numpy())
                passes.append(np.concatenate(parts))
            expected[split] = logsumexp(passes, axis=0) - math.log(replicas)
        np.testing.assert_allclose(
            idata.log_likelihood["y_train"].values[0, s], expected["train"], rtol=1e-5, atol=1e-6
        )
        np.testing.assert_allclose(
            idata.posterior_predictive["log_lik_test"].values[0, s],
            expected["test"],
            rtol=1e-5,
            atol=1e-6,
        )


def test_arviz_reads_it_as_it_reads_predictive_nc(fitted):
    idata = idata_of(fitted)
    other = idata_of(fitted, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # ArviZ's k̂ warning: 12 draws
        loo = az.loo(idata)
        pit = az.loo_pit(idata, y="y_train")
        table = az.compare({"a": idata, "b": other})
    assert loo.n_data_points == N_TRAIN and np.isfinite(loo.elpd_loo)
    assert pit.shape == (N_TRAIN,) and ((0 <= pit) & (pit <= 1)).all()
    assert set(table.index) == {"a", "b"} and np.isfinite(table["elpd_loo"]).all()
    assert len(np.ravel(az.plot_ppc(idata, num_pp_samples=5))) == 2  # y_train and y_test
    summary = az.summary(idata, kind="stats")
    assert "readout.weight[2, 7]" in summary.index
    az.plot_forest(idata, var_names=["readout.weight"])
    matplotlib.pyplot.close("all")


class Regression(PyroModule):
    def __init__(self) -> None:
        super().__init__()
        self.weight = PyroSample(dist.Normal(0.0, 1.0).expand([8]).to_event(1))

    def forward(self, x, y=None):
        weight = self.weight
        with pyro.plate("data", len(x)):
            return pyro.sample("y", dist.Normal(x.mean(1) @ weight, 1.0), obs=y)


class LocalLatent(PyroModule):
    """A latent z per example, which an autoguide draws: a local site."""

    def forward(self, x, y=None):
        with pyro.plate("data", len(x)):
            z = pyro.sample("z", dist.Normal(0.0, 1.0))
            logits = torch.stack([z, -z], -1)
            return pyro.sample("y", dist.Categorical(logits=logits), obs=y)


def test_bad_models_and_inputs_are_refused_with_one_line(fitted):
    model, guide, x, y = fitted
    train, test = (x[:N_TRAIN], y[:N_TRAIN]), (x[N_TRAIN:], y[N_TRAIN:])
    with pytest.raises(ProbtransError, match="a Categorical likelihood at 'y'.*Normal"):
        regression = Regression()
        probtrans.to_inference_data(
            regression, AutoNormal(regression), x[:4], y[:4].float(), x[4:8], y[4:8].float()
        )
    local = LocalLatent()
    with pytest.raises(ProbtransError, match="'z', a local site"):
        binary = y.clamp(max=1)
        probtrans.to_inference_data(
            local, AutoNormal(local), x[:4], binary[:4], x[4:8], binary[4:8]
        )
    with pytest.raises(ProbtransError, match=r"y_test must lie in \[0, 3\)"):
        probtrans.to_inference_data(model, guide, *train, x[N_TRAIN:], y[N_TRAIN:] + 1)
    with pytest.raises(ProbtransError, match="observed_site 'label' is not an observed site"):
        probtrans.to_inference_data(model, guide, *train, *test, observed_site="label")
    with pytest.raises(
        ProbtransError, match=r"x_test \(N, ...\) and y_test \(N,\) must hold the same number"
    ):
        probtrans.to_inference_data(model, guide, *train, x[N_TRAIN:], y[N_TRAIN + 1 :])
    with pytest.raises(ProbtransError, match="class_names must name the model's 3 classes"):
        probtrans.to_inference_data(model, guide, *train, *test, class_names=["a", "b"])


# ----------------------------------------------------------------------------- metrics on arrays
def test_ece_of_a_small_array_by_hand():
    mean_probs = np.array([[0.9, 0.1, 0.0], [0.6, 0.4, 0.0], [0.3, 0.7, 0.0], [0.2, 0.0, 0.8]])
    labels = np.array([0, 1, 1, 2])
    # five bins: 0.6 → (0.4, 0.6], wrong; 0.7, 0.8 → (0.6, 0.8], right; 0.9 → (0.8, 1], right
    assert probtrans.ece(mean_probs, labels, n_bins=5) == pytest.approx(
        (1 * 0.6 + 2 * abs(1 - 0.75) + 1 * 0.1) / 4
    )
    with pytest.raises(ValueError, match=r"draws \(S, N, C\): pass their mean over axis 0"):
        probtrans.ece(mean_probs[None], labels)
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        probtrans.ece(mean_probs, labels + 1)


def test_ood_auroc_is_the_probability_that_an_outlier_scores_higher():
    rng = np.random.default_rng(0)
    score_in, score_out = rng.normal(size=30), rng.normal(0.8, 1.0, size=20).round(1)
    score_in[:5] = score_out[:5]  # ties count one half
    pairs = score_out[None, :] - score_in[:, None]  # (N_in, N_out)
    mann_whitney = ((pairs > 0).sum() + 0.5 * (pairs == 0).sum()) / pairs.size
    assert probtrans.ood_detection(score_in, score_out)["auroc"] == pytest.approx(mann_whitney)
    probs_in = rng.dirichlet(np.ones(3), size=(6, 30))  # (S, N_in, C)
    probs_out = rng.dirichlet(np.ones(3) * 0.3, size=(6, 20))
    report = probtrans.ood_report(probs_in, probs_out)
    direct = probtrans.ood_detection(mutual_information(probs_in), mutual_information(probs_out))
    assert report["mutual_information"] == direct
    with pytest.raises(ValueError, match="score_out holds 1 non-finite values"):
        probtrans.ood_detection(score_in, np.array([0.1, np.nan]))


def test_heldout_elpd_is_the_log_mean_of_the_label_probability():
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(4), size=(7, 9))  # (S, N, C)
    labels = rng.integers(0, 4, size=9)
    elpd, se, pointwise = probtrans.heldout_elpd(probs, labels)
    by_hand = np.array([logsumexp(np.log(probs[:, n, labels[n]])) - math.log(7) for n in range(9)])
    np.testing.assert_allclose(pointwise, by_hand, rtol=1e-12)
    assert elpd == pytest.approx(by_hand.sum())
    assert se == pytest.approx(math.sqrt(9 * np.var(by_hand)))
    with pytest.raises(ValueError, match=r"probs must be 3-D \(draws S"):
        probtrans.heldout_elpd(probs[0], labels)
    with pytest.raises(ValueError, match=r"labels must be integers of shape \(9,\)"):
        probtrans.heldout_elpd(probs, labels.astype(float))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\)"):
        probtrans.heldout_elpd(probs, labels + 4)
