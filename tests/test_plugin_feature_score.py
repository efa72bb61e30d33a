"""A feature score added by a plugin: one module with a ``FeatureScore`` class and one
registration call (here the Euclidean distance to the nearest class mean) is fitted with the
others, kept in ``feature_scores.npz``, reported for every out-of-domain set in
``metrics.json`` and by ``probtrans evaluate``, and predicted with its percentile. A run folder
that keeps a score no longer registered is read without it."""

from __future__ import annotations

import numpy as np
import pytest

from probtrans.analysis.feature_scores import FEATURE_SCORES
from probtrans.analysis.metrics import UNCERTAINTY_SCORES
from probtrans.cli import main
from tests.conftest import plugin_imported, tiny_inference

PLUGIN = '''
"""A toy plugin: the Euclidean distance to the nearest class mean."""

from dataclasses import dataclass

import numpy as np

from probtrans.analysis.feature_scores import FeatureScore, register_feature_score


@register_feature_score
@dataclass(frozen=True)
class NearestMean(FeatureScore):
    name = "nearest_mean"
    label = "distance to the nearest class mean"

    means: np.ndarray  # (K, D)

    @classmethod
    def fit(cls, train):
        return cls(train.means)

    @property
    def dim(self):
        return self.means.shape[1]

    def score(self, x):
        return np.linalg.norm(x[:, None, :] - self.means[None], axis=-1).min(axis=1)
'''


@pytest.fixture
def plugin(tmp_path):
    """The plugin module imported (its one registration), forgotten after the test."""
    with plugin_imported(
        tmp_path, "nearest_mean_plugin", PLUGIN, FEATURE_SCORES, UNCERTAINTY_SCORES
    ):
        yield


def test_a_plugin_feature_score_is_fitted_kept_reported_and_predicted(
    plugin, tmp_path, tiny_model_file, capsys
):
    import probtrans
    from probtrans.runs import Run
    from probtrans.runs.kept import read_probs

    text = tiny_model_file.read_text().replace('kind = "h_sto"', 'kind = "softmax"')
    tiny_model_file.write_text(text.replace("tau1 = 1.0\ntau2 = 2.0\nn_centroids = 3\n", ""))
    # softmax attention: the features, and so the predicted scores, are the kept ones
    run = probtrans.fit(
        tiny_model_file, tiny_inference(tmp_path, "map"), out=tmp_path / "run", epochs=1
    )
    assert list(FEATURE_SCORES)[-1] == "nearest_mean"  # registered after the built-in ones
    with np.load(run.path / "feature_scores.npz") as kept:
        means = kept["nearest_mean.means"]
        np.testing.assert_array_equal(means, kept["mahalanobis.means"])  # the same class means
    report = run.metrics["ood"]["digits_8_9"]["nearest_mean"]
    assert 0.0 <= report["auroc"] <= 1.0 and 0.0 <= report["aupr"] <= 1.0

    capsys.readouterr()
    assert main(["evaluate", str(run.path), "--quiet"]) == 0
    header = next(line for line in capsys.readouterr().out.splitlines() if "mahalanobis" in line)
    assert header.split()[-1] == "nearest_mean"  # the OOD table's last column

    columns = Run.load(run.path).predict(run.data.test)
    kept = read_probs(run.path / "probs.npz").features["test"]["nearest_mean"]
    np.testing.assert_allclose(columns["nearest_mean"], kept, rtol=1e-5)
    assert 0.0 <= columns["nearest_mean_percentile"].min()
    assert columns["nearest_mean_percentile"].max() <= 100.0


def test_a_run_keeping_a_score_no_longer_registered_is_read_without_it(tmp_path, tiny_model_file):
    import probtrans
    from probtrans.runs import Run

    registries = (FEATURE_SCORES, UNCERTAINTY_SCORES)
    with plugin_imported(tmp_path, "nearest_mean_plugin", PLUGIN, *registries):
        inference = tiny_inference(tmp_path, "map")
        run = probtrans.fit(tiny_model_file, inference, out=tmp_path / "run", epochs=1)
    with np.load(run.path / "feature_scores.npz") as kept:
        assert "nearest_mean.means" in kept.files
    assert "nearest_mean" not in FEATURE_SCORES and "nearest_mean" not in UNCERTAINTY_SCORES
    columns = Run.load(run.path).predict(run.data.test)
    assert "nearest_mean" not in columns
    assert set(FEATURE_SCORES) <= set(columns)
