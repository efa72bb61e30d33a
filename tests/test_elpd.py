"""ELPD done right: held-out ELPD on the test split, PSIS-LOO over the training examples with the
local randomness averaged out, the posterior group of ``predictive.nc``."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest
from scipy.special import logsumexp

from probtrans.analysis.elpd import MIN_LOO_DRAWS, heldout_elpd, psis_loo
from probtrans.inference.predictive import global_sites
from probtrans.resolve import load_inference_spec
from probtrans.runs import fit, load_run
from probtrans.runs.compare import markdown, rank_by_elpd
from probtrans.runs.kept import read_probs
from probtrans.specs import Comparison, Method
from probtrans.specs.inference import AUTOMATIC_LOO_SAMPLES
from tests.conftest import TINY_MODEL, tiny_inference

with warnings.catch_warnings():
    warnings.simplefilter("ignore", FutureWarning)
    import arviz as az


def fitted(tmp_path_factory: pytest.TempPathFactory, guide: str):
    """A tiny H-STO run (2 epochs) of ``guide``, at the default ``[predictive]`` settings but
    samples = 4 (the other tests' tiny runs average 2 replicas, not 10)."""
    folder = tmp_path_factory.mktemp(guide)
    model = folder / "tiny.toml"
    model.write_text(TINY_MODEL)
    inference = tiny_inference(folder, guide)
    inference.write_text(inference.read_text().replace("replicas = 2\n", ""))
    assert load_inference_spec(inference).predictive.replicas == 10
    fit(model, inference, out=folder / "run", progress=False)
    return folder / "run"


@pytest.fixture(scope="module")
def map_run(tmp_path_factory):
    return fitted(tmp_path_factory, "map")


@pytest.fixture(scope="module")
def mfvi_run(tmp_path_factory):
    return fitted(tmp_path_factory, "mfvi")


def metrics_of(run):
    return json.loads((run / "metrics.json").read_text())


def test_a_point_mass_posterior_has_p_loo_0_and_no_pareto_diagnosis(map_run):
    """MAP (delta guide) on H-STO: the local randomness is averaged inside the likelihood, so all
    global draws give one log-likelihood, LOO is the in-sample lpd and k̂ is not reported."""
    written = metrics_of(map_run)
    assert abs(written["p_loo"]) < 0.5
    assert written["loo_k_bad"] == 0
    assert "point-mass" in written["loo_note"] and "∞" not in written["loo_note"]
    idata = az.from_netcdf(map_run / "predictive.nc")
    log_lik = idata.log_likelihood["y_train"].values[0]  # (S, N_train)
    assert (log_lik == log_lik[:1]).all()
    assert written["loo"] == pytest.approx(log_lik[0].sum())
    loo = psis_loo(log_lik, point_mass=True)
    assert (loo.k_bad, loo.k_inf, loo.k_threshold) == (0, 0, None) and loo.reliable


def test_mfvi_at_the_default_settings_has_finite_pareto_k_on_the_training_examples(mfvi_run):
    idata = az.from_netcdf(mfvi_run / "predictive.nc")
    assert idata.log_likelihood["y_train"].shape[1] == AUTOMATIC_LOO_SAMPLES  # loo_samples unset
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # ArviZ's k̂ warning
        loo = az.loo(idata, pointwise=True)
    assert np.isfinite(loo.pareto_k.values).mean() >= 0.95
    written = metrics_of(mfvi_run)
    assert written["loo"] == pytest.approx(loo.elpd_loo) and written["p_loo"] > 0
    assert written["loo_se"] == pytest.approx(loo.se)
    assert written["loo_k_bad"] == int((loo.pareto_k.values > loo.good_k).sum())


def test_heldout_elpd_is_the_log_mean_over_draws_of_the_label_probability(mfvi_run):
    kept = read_probs(mfvi_run / "probs.npz")
    probs, labels = kept.probs, kept.labels
    test, y = probs["plain"]["test"].astype(np.float64), labels["test"]  # (S, N, C), (N,)
    n_draws, n = test.shape[:2]
    pointwise = logsumexp(np.log(test[:, np.arange(n), y]), axis=0) - math.log(n_draws)
    written = metrics_of(mfvi_run)
    assert written["test_elpd"] == pytest.approx(pointwise.sum(), rel=1e-9)
    assert written["test_elpd_se"] == pytest.approx(math.sqrt(n) * pointwise.std(), rel=1e-9)
    elpd, se, values = heldout_elpd(probs["plain"]["test"], y)
    np.testing.assert_allclose(values, pointwise, rtol=1e-12)
    # with the local randomness averaged over R replicas: the same quantity, another estimate
    idata = az.from_netcdf(mfvi_run / "predictive.nc")
    per_draw = idata.posterior_predictive["log_lik_test"].values[0]  # (S', N)
    replicated = logsumexp(per_draw, axis=0) - math.log(len(per_draw))
    assert abs(replicated.sum() - elpd) < 3 * se


def test_the_posterior_group_holds_every_global_site_as_the_guide_draws_it(mfvi_run):
    """The posterior, the log-likelihood and the posterior predictive share the LOO's draws
    (ArviZ's convention), the first of those evaluate drew."""
    idata = az.from_netcdf(mfvi_run / "predictive.nc")
    run = load_run(mfvi_run)
    shared = AUTOMATIC_LOO_SAMPLES
    draws = run.posterior_samples(shared, seed=0)  # the seed evaluate used
    sites = global_sites(run.classifier)
    assert sites and set(idata.posterior.data_vars) == set(sites)
    for site in sites:
        value = idata.posterior[site].values
        assert value.shape == (1, shared, *draws[site].shape[1:])
        np.testing.assert_array_equal(value[0], draws[site].numpy())
    for group in ("posterior", "log_likelihood", "posterior_predictive"):
        assert idata[group].sizes["draw"] == shared, group


def test_az_loo_on_the_file_is_psis_loo_over_the_training_examples(mfvi_run):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # opening and summarising the file: no warning at all
        idata = az.from_netcdf(mfvi_run / "predictive.nc")
        az.summary(idata, kind="stats")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # ArviZ's k̂ warning
        loo = az.loo(idata)
    assert loo.n_data_points == len(load_run(mfvi_run).data.train)
    assert list(idata.log_likelihood.data_vars) == ["y_train"]
    assert idata.observed_data["y_train"].shape == (loo.n_data_points,)


def test_arviz_reads_the_file_by_its_conventions(mfvi_run):
    """``y_train`` and ``y_test`` in every group that has them, the same draws: ``az.loo_pit``,
    ``az.plot_ppc``, ``az.summary``, ``az.compare`` and ``az.plot_forest`` run on
    ``predictive.nc`` as it is, and the posterior-predictive labels follow each draw's class
    probabilities."""
    import matplotlib

    matplotlib.use("Agg")
    idata = az.from_netcdf(mfvi_run / "predictive.nc")
    assert set(idata.observed_data.data_vars) == {"y_train", "y_test"}
    assert {"y_train", "y_test"} <= set(idata.posterior_predictive.data_vars)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        pit = az.loo_pit(idata, y="y_train")
        table = az.compare({"a": idata, "b": idata})  # the InferenceData, not its az.loo
        loo = az.loo(idata)
    assert list(table["elpd_loo"]) == pytest.approx([loo.elpd_loo] * 2)
    assert pit.shape == idata.observed_data["y_train"].shape and ((0 <= pit) & (pit <= 1)).all()
    axes = az.plot_ppc(idata, num_pp_samples=20)
    assert len(np.ravel(axes)) == 2  # y_train and y_test
    summary = az.summary(idata, kind="stats")
    assert len(summary) and "head.bias[0]" in summary.index
    az.plot_forest(idata, var_names=["head.bias"])
    drawn = idata.posterior_predictive["y_test"].values[0]  # (S, N)
    observed = idata.observed_data["y_test"].values  # (N,)
    p_observed = np.exp(idata.posterior_predictive["log_lik_test"].values[0])  # (S, N)
    assert (drawn == observed).mean() == pytest.approx(p_observed.mean(), abs=0.02)


def test_psis_loo_flags_too_few_draws_and_agrees_with_arviz():
    rng = np.random.default_rng(0)
    mean = rng.normal(-0.5, 0.3, size=200)  # (N,)
    log_lik = mean + rng.normal(0.0, 0.05, size=(MIN_LOO_DRAWS, 200))  # (S, N)
    loo = psis_loo(log_lik, point_mass=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # ArviZ's k̂ warning
        reference = az.loo(az.from_dict(log_likelihood={"y": log_lik[None]}), reff=1.0)
    assert (loo.elpd, loo.se, loo.p_loo) == pytest.approx(
        (reference.elpd_loo, reference.se, reference.p_loo)
    )
    # k̂ of 100 draws is noisy around its threshold 1 − 1/log10(100) = 0.5: a few cross it
    assert loo.k_threshold == pytest.approx(0.5) and loo.k_inf == 0 and loo.reliable
    assert loo.k_bad <= 0.05 * 200 and f"on {loo.k_bad} of 200" in loo.note
    few = psis_loo(log_lik[:20], point_mass=False)
    assert not few.reliable and "only 20 global draws" in few.note


def test_compare_ranks_on_the_heldout_elpd_with_the_se_of_paired_differences():
    labels, other = np.array([0, 1, 0, 1]), np.array([1, 1, 0, 0])
    best = np.log([0.9, 0.8, 0.7, 0.9])  # pointwise held-out ELPD (N,)
    worse = np.log([0.5, 0.6, 0.9, 0.4])
    rows = [{"method": "worse"}, {"method": "best"}, {"method": "elsewhere"}]
    rank_by_elpd(rows, [(labels, worse), (labels, best), (other, np.log([0.99] * 4))])
    assert [row["ELPD rank"] for row in rows] == ["3", "2", "1"]
    assert rows[2]["Δ ELPD (SE)"] == "0.0 (0.0)"  # the best: another test split
    assert rows[0]["Δ ELPD (SE)"] == rows[1]["Δ ELPD (SE)"] == "–"
    rank_by_elpd(rows[:2], [(labels, worse), (labels, best)])
    difference = worse - best
    se = math.sqrt(4 * difference.var())
    assert rows[0]["Δ ELPD (SE)"] == f"{difference.sum():.1f} ({se:.1f})"
    rows[0]["LOO"], rows[1]["LOO"] = "-10.00!", "-8.00†"
    method = Method(name="worse", model="m.toml", inference="i.toml")
    text = markdown(rows[:2], Comparison(title="t", method=[method]))
    assert "**Warning**: the LOO of worse is unreliable." in text and "† a point-mass" in text
