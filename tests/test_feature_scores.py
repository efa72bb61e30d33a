"""Tests of probtrans.analysis.feature_scores against scikit-learn and scipy on a hand-made
example."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import logsumexp
from scipy.stats import multivariate_normal
from sklearn.covariance import LedoitWolf
from sklearn.metrics import roc_auc_score
from sklearn.neighbors import NearestNeighbors

from probtrans.analysis.feature_scores import FEATURE_SCORES, FittedScores, fit_feature_scores, knn
from probtrans.analysis.metrics import UNCERTAINTY_SCORES
from probtrans.errors import ProbtransError

DIM = 5
SIZES = (60, 80, 100)  # rows per class: unequal, so the mixture weights π_c matter
OFFSET = 10.0 * np.eye(DIM)[4]  # features share a non-zero mean, as real features do
CENTRES = OFFSET + 3.0 * np.eye(DIM)[:3]  # class c is centred on 10 e_4 + 3 e_c


def gaussian_classes(rng: np.random.Generator, sizes=SIZES) -> tuple[np.ndarray, np.ndarray]:
    """Rows of three Gaussian classes in 5-D, each with its own (random) covariance."""
    rows, labels = [], []
    for c, size in enumerate(sizes):
        scale = np.eye(DIM) + 0.3 * rng.normal(size=(DIM, DIM))
        rows.append(CENTRES[c] + rng.normal(size=(size, DIM)) @ scale)
        labels.append(np.full(size, c))
    return np.concatenate(rows), np.concatenate(labels)


@pytest.fixture(scope="module")
def example() -> dict[str, np.ndarray]:
    """Training rows (240, 5) as float32 like real features, held-out in-distribution rows
    (240, 5), and 50 far-away OOD rows around 10 e_4 + 8 (e_0 + e_1 − 2 e_2): in the plane of
    the class means (relative Mahalanobis discounts the directions in which the classes do not
    differ) and in a direction no class has (k-NN reads directions only)."""
    rng = np.random.default_rng(0)
    train, labels = gaussian_classes(rng)
    held_out, _ = gaussian_classes(rng)
    ood = OFFSET + 8.0 * np.array([1.0, 1.0, -2.0, 0.0, 0.0]) + rng.normal(size=(50, DIM))
    return {
        "train": train.astype(np.float32),
        "labels": labels,
        "query": np.concatenate([held_out, ood]),
        "is_ood": np.r_[np.zeros(len(held_out)), np.ones(len(ood))],
    }


def class_means(train: np.ndarray, labels: np.ndarray) -> np.ndarray:
    return np.stack([train[labels == c].mean(axis=0) for c in np.unique(labels)])


def sklearn_squared_mahalanobis(train, labels, query) -> np.ndarray:
    """MD_c(x) under the tied Ledoit–Wolf covariance of the class-centred rows: (M, K)."""
    train = train.astype(np.float64)
    means = class_means(train, labels)
    tied = LedoitWolf(assume_centered=True).fit(train - means[labels])
    return np.stack([tied.mahalanobis(query - mean) for mean in means], axis=1)


# ----------------------------------------------------------------------------- each score
def test_mahalanobis_is_the_minimum_tied_ledoit_wolf_distance(example):
    fitted = fit_feature_scores(example["train"], example["labels"], n_classes=3)
    expected = sklearn_squared_mahalanobis(example["train"], example["labels"], example["query"])
    got = fitted.scores(example["query"])["mahalanobis"]
    np.testing.assert_allclose(got, expected.min(axis=1), rtol=1e-10)


def test_relative_mahalanobis_subtracts_the_background_distance(example):
    fitted = fit_feature_scores(example["train"], example["labels"], n_classes=3)
    per_class = sklearn_squared_mahalanobis(example["train"], example["labels"], example["query"])
    background = LedoitWolf().fit(example["train"].astype(np.float64)).mahalanobis(example["query"])
    got = fitted.scores(example["query"])["relative_mahalanobis"]
    np.testing.assert_allclose(got, (per_class - background[:, None]).min(axis=1), rtol=1e-9)


def test_feature_density_is_minus_the_class_mixture_log_density(example):
    train, labels, query = example["train"].astype(np.float64), example["labels"], example["query"]
    fitted = fit_feature_scores(train, labels, n_classes=3)
    log_terms = []
    for c, mean in enumerate(class_means(train, labels)):
        own = train[labels == c]
        covariance = LedoitWolf(assume_centered=True).fit(own - mean).covariance_
        weight = len(own) / len(train)
        log_terms.append(np.log(weight) + multivariate_normal(mean, covariance).logpdf(query))
    expected = -logsumexp(np.stack(log_terms, axis=1), axis=1)
    np.testing.assert_allclose(fitted.scores(query)["feature_density"], expected, rtol=1e-10)
    assert fitted["feature_density"].shared_covariance_classes == []


def sklearn_kth_distance(train: np.ndarray, query: np.ndarray, k: int) -> np.ndarray:
    def unit(rows):
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    search = NearestNeighbors(n_neighbors=k).fit(unit(train.astype(np.float64)))
    return search.kneighbors(unit(query))[0][:, -1]


@pytest.mark.parametrize("k", [1, 10])
def test_knn_is_the_kth_nearest_normalised_distance(example, k):
    fitted = fit_feature_scores(example["train"], example["labels"], n_classes=3, k=k)
    expected = sklearn_kth_distance(example["train"], example["query"], k)
    got = fitted.scores(example["query"])["knn"]
    np.testing.assert_allclose(got, expected, rtol=1e-10)


def test_knn_in_small_chunks_equals_one_chunk(example, monkeypatch):
    fitted = fit_feature_scores(example["train"], example["labels"], n_classes=3, k=10)
    whole = fitted.scores(example["query"])["knn"]
    row_bytes = 8 * len(example["train"])  # one float64 row of the distance matrix
    for rows in (1, 7):
        monkeypatch.setattr(knn, "KNN_CHUNK_BYTES", rows * row_bytes)
        np.testing.assert_allclose(fitted.scores(example["query"])["knn"], whole, rtol=1e-12)


def test_k_is_capped_at_the_training_rows(example):
    fitted = fit_feature_scores(example["train"][:8], example["labels"][:8], n_classes=3, k=50)
    assert fitted["knn"].k == 8
    expected = sklearn_kth_distance(example["train"][:8], example["query"], 8)
    np.testing.assert_allclose(fitted.scores(example["query"])["knn"], expected, rtol=1e-10)


def test_every_score_ranks_far_ood_above_held_out_rows(example):
    fitted = fit_feature_scores(example["train"], example["labels"], n_classes=3, k=10)
    scores = fitted.scores(example["query"])
    assert tuple(scores) == tuple(FEATURE_SCORES)
    for name in FEATURE_SCORES:
        assert scores[name].shape == (len(example["query"]),)
        assert scores[name].dtype == np.float64
        assert roc_auc_score(example["is_ood"], scores[name]) > 0.95, name
    registered = {s.name for s in UNCERTAINTY_SCORES.entries() if s.function is None}
    assert set(FEATURE_SCORES) <= registered  # every report shows them


def test_the_uncertainty_scores_hold_the_feature_scores_whoever_reads_them_first():
    """A fresh process that reads the uncertainty scores without importing the feature scores
    sees them, after the scores of the probabilities; one that imports them first, the same."""
    import subprocess
    import sys

    expected = [s.name for s in UNCERTAINTY_SCORES.entries()]
    assert expected[-len(FEATURE_SCORES) :] == list(FEATURE_SCORES)
    for first in ("probtrans.analysis.metrics", "probtrans.analysis.feature_scores"):
        code = (
            f"import {first}; from probtrans.analysis.metrics import UNCERTAINTY_SCORES; "
            "print(' '.join(UNCERTAINTY_SCORES))"
        )
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        assert out.stdout.split() == expected, out.stderr


# ----------------------------------------------------------------------------- small classes
def test_a_class_with_fewer_rows_than_dimensions_uses_the_shared_covariance():
    rng = np.random.default_rng(1)
    train, labels = gaussian_classes(rng, sizes=(60, 3, 1))  # N_1 = 3 ≤ D, N_2 = 1 < 2
    query, _ = gaussian_classes(rng, sizes=(10, 10, 10))
    fitted = fit_feature_scores(train, labels, n_classes=3)
    assert fitted["feature_density"].shared_covariance_classes == [1, 2]
    for c in (1, 2):
        np.testing.assert_array_equal(
            fitted["feature_density"].class_cholesky[c], fitted["mahalanobis"].shared_cholesky
        )

    means = class_means(train, labels)
    tied = LedoitWolf(assume_centered=True).fit(train - means[labels]).covariance_
    own = LedoitWolf(assume_centered=True).fit(train[labels == 0] - means[0]).covariance_
    log_terms = [
        np.log(np.mean(labels == c)) + multivariate_normal(means[c], cov).logpdf(query)
        for c, cov in enumerate((own, tied, tied))
    ]
    expected = -logsumexp(np.stack(log_terms, axis=1), axis=1)
    np.testing.assert_allclose(fitted.scores(query)["feature_density"], expected, rtol=1e-10)


def test_a_class_without_training_rows_is_left_out_and_recorded(example):
    with_empty = fit_feature_scores(example["train"], example["labels"], n_classes=4)
    without = fit_feature_scores(example["train"], example["labels"], n_classes=3)
    assert with_empty.missing_classes == [3]
    assert without.missing_classes == []
    got, expected = with_empty.scores(example["query"]), without.scores(example["query"])
    for name in FEATURE_SCORES:
        np.testing.assert_array_equal(got[name], expected[name])


# ----------------------------------------------------------------------------- persistence
def test_npz_round_trip_gives_identical_scores(example, tmp_path):
    rng = np.random.default_rng(2)
    train, labels = gaussian_classes(rng, sizes=(60, 3, 40))  # one class falls back
    fitted = fit_feature_scores(train.astype(np.float32), labels, n_classes=4, k=10)
    np.savez(tmp_path / "features.npz", **fitted.to_arrays())
    with np.load(tmp_path / "features.npz", allow_pickle=False) as arrays:
        loaded = FittedScores.from_arrays(arrays)
    assert loaded["feature_density"].shared_covariance_classes == [1]
    assert loaded.missing_classes == [3]
    assert loaded["knn"].k == 10
    original, reloaded = fitted.scores(example["query"]), loaded.scores(example["query"])
    for name in FEATURE_SCORES:
        np.testing.assert_array_equal(reloaded[name], original[name])


def test_from_arrays_names_what_is_missing(example):
    arrays = fit_feature_scores(example["train"], example["labels"], n_classes=3).to_arrays()
    del arrays["knn.knn_train"]
    with pytest.raises(ProbtransError, match=r"lack knn\.knn_train"):
        FittedScores.from_arrays(arrays)


def test_a_file_of_probtrans_0_1_without_score_prefixes_gives_the_same_scores(example):
    """``feature_scores.npz`` written before each score was its own class held one flat set
    of arrays (``means``, ``knn_train``, ...): read as the four built-in scores."""
    fitted = fit_feature_scores(example["train"], example["labels"], n_classes=3, k=10)
    flat = {key.split(".")[-1]: value for key, value in fitted.to_arrays().items()}
    assert sorted(flat) == sorted(
        ["n_classes", "classes", "means", "weights", "shared_cholesky", "class_cholesky"]
        + ["background_mean", "background_cholesky", "shared_covariance_classes"]
        + ["knn_train", "k"]
    )  # the layout of probtrans 0.1's FeatureDensity.to_arrays
    loaded = FittedScores.from_arrays(flat)
    assert list(loaded.fitted) == list(FEATURE_SCORES)
    original, reloaded = fitted.scores(example["query"]), loaded.scores(example["query"])
    for name in FEATURE_SCORES:
        np.testing.assert_array_equal(reloaded[name], original[name])


# ----------------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    ("features", "labels", "message"),
    [
        (np.zeros(10), np.zeros(10, int), r"2-D .* got shape \(10,\)"),
        (np.zeros((10, 2, 2)), np.zeros(10, int), r"2-D .* got shape \(10, 2, 2\)"),
        (np.zeros((0, 3)), np.zeros(0, int), r"non-empty .* got shape \(0, 3\)"),
        (np.ones((10, 3)), np.zeros(9, int), r"labels must have shape \(10,\) .* \(9,\)"),
        (np.ones((10, 3)), np.zeros(10), "labels must be integers"),
        (np.ones((10, 3)), np.full(10, 3), r"labels must lie in \[0, 3\)"),
        (np.full((10, 3), np.nan), np.zeros(10, int), r"shape \(10, 3\) has non-finite .* 10 rows"),
        (np.ones((1, 3)), np.zeros(1, int), r"at least 2 training rows, got shape \(1, 3\)"),
        (np.ones((10, 3)), np.zeros(10, int), r"shape \(10, 3\)\) is singular"),
    ],
)
def test_bad_training_input_is_refused_naming_the_shape(features, labels, message):
    with pytest.raises(ProbtransError, match=message):
        fit_feature_scores(features, labels, n_classes=3)


def test_bad_k_is_refused(example):
    with pytest.raises(ProbtransError, match="k of k-NN must be at least 1"):
        fit_feature_scores(example["train"], example["labels"], n_classes=3, k=0)


def test_bad_scoring_input_is_refused_naming_the_shape(example):
    fitted = fit_feature_scores(example["train"], example["labels"], n_classes=3)
    with pytest.raises(ProbtransError, match=r"5 dimensions, .* got shape \(4, 6\)"):
        fitted.scores(np.zeros((4, 6)))
    with pytest.raises(ProbtransError, match=r"got shape \(5,\)"):
        fitted.scores(np.zeros(5))
    query = example["query"].copy()
    query[3, 2] = np.inf
    with pytest.raises(ProbtransError, match=r"shape \(290, 5\) has non-finite .* 1 rows"):
        fitted.scores(query)


# ----------------------------------------------------------------------------- in a run
def test_a_run_keeps_its_feature_scores_and_a_copied_folder_gives_the_same(
    tmp_path, tiny_model_file
):
    """``fit`` fits the scores on the training split and keeps them; the OOD report has them;
    ``Run.predict`` from a copy of the folder gives the test split's kept scores again (softmax
    attention: the features do not depend on attention samples)."""
    import shutil

    from probtrans.runs import Run, fit
    from probtrans.runs.kept import read_probs
    from tests.conftest import tiny_inference

    text = tiny_model_file.read_text().replace('kind = "h_sto"', 'kind = "softmax"')
    tiny_model_file.write_text(text.replace("tau1 = 1.0\ntau2 = 2.0\nn_centroids = 3\n", ""))
    run = fit(tiny_model_file, tiny_inference(tmp_path, "map"), out=tmp_path / "run", epochs=1)
    assert (run.path / "feature_scores.npz").is_file()
    report = run.metrics["ood"]["digits_8_9"]
    assert all(0.0 <= report[name]["auroc"] <= 1.0 for name in FEATURE_SCORES)
    kept = read_probs(run.path / "probs.npz").features
    assert set(kept) == {"val", "test", "ood:digits_8_9"} and set(kept["test"]) == set(
        FEATURE_SCORES
    )

    copied = Run.load(shutil.copytree(run.path, tmp_path / "elsewhere"))
    columns = copied.predict(copied.data.test)
    for name in FEATURE_SCORES:
        np.testing.assert_allclose(columns[name], kept["test"][name], rtol=1e-5, atol=1e-6)
        percentile = columns[f"{name}_percentile"]
        assert percentile.min() >= 0.0 and percentile.max() <= 100.0


def test_a_run_without_feature_scores_is_fitted_by_evaluate_and_noted_by_predict(
    tmp_path, tiny_model_file, capsys
):
    """A run folder written before the scores were fitted: ``predict`` says how to get them and
    predicts without them; ``evaluate`` fits them and says so."""
    from probtrans.cli import main
    from probtrans.runs import Run, fit
    from tests.conftest import tiny_inference

    run = fit(tiny_model_file, tiny_inference(tmp_path, "map"), out=tmp_path / "run", epochs=1)
    (run.path / "feature_scores.npz").unlink()
    capsys.readouterr()
    columns = Run.load(run.path).predict(run.data.test)
    assert "has no feature scores" in capsys.readouterr().err
    assert not set(FEATURE_SCORES) & set(columns)
    assert main(["evaluate", str(run.path), "--quiet"]) == 0
    assert "fitting its feature scores" in capsys.readouterr().err
    assert (run.path / "feature_scores.npz").is_file()
    assert set(FEATURE_SCORES) <= set(Run.load(run.path).predict(run.data.test))


def edited(path, changes: dict) -> None:
    """Rewrite the ``.npz`` at ``path`` with some arrays (name → value) replaced."""
    arrays = dict(np.load(path))
    arrays.update({name: np.asarray(value) for name, value in changes.items()})
    np.savez(path, **arrays)


@pytest.mark.parametrize(
    "damage, reason",
    [
        ("foreign", "fitted for another checkpoint than this run's"),
        ("nan_means", "mahalanobis: means holds NaN or infinite values"),
        ("k_above_rows", "k = 100000 for"),
        ("classes", "fitted for 12 classes; this run's network has 8"),
        ("width", "fitted on different feature widths: mahalanobis 16, relative_mahalanobis"),
    ],
)
def test_a_feature_score_file_not_of_its_run_is_refused_by_predict_and_refitted_by_evaluate(
    tmp_path, tiny_model_file, damage, reason, capsys
):
    """``feature_scores.npz`` is tied to its checkpoint and checked: one copied from another
    run, or holding NaN, a k above its training rows, another class count or inconsistent
    shapes, is refused by ``predict`` in one error naming the file and the command that
    refits it; ``evaluate`` refits it, and ``predict`` then works."""
    import shutil

    from probtrans.cli import main
    from probtrans.runs import Run, fit
    from probtrans.storage.io import DamagedFile
    from tests.conftest import tiny_inference

    inference = tiny_inference(tmp_path, "map")
    run = fit(tiny_model_file, inference, out=tmp_path / "run", epochs=1)
    path = run.path / "feature_scores.npz"
    if damage == "foreign":
        other = fit(tiny_model_file, inference, out=tmp_path / "other", epochs=1, seed=1)
        shutil.copyfile(other.path / "feature_scores.npz", path)
    elif damage == "nan_means":
        means = np.load(path)["mahalanobis.means"].copy()
        means[0, 0] = np.nan
        edited(path, {"mahalanobis.means": means})
    elif damage == "k_above_rows":
        edited(path, {"knn.k": 100000})
    elif damage == "classes":
        edited(path, {"n_classes": 12})
    else:  # features of another width than the kept class means
        edited(path, {"knn.knn_train": np.load(path)["knn.knn_train"][:, :3]})
    with pytest.raises(DamagedFile) as refused:
        Run.load(run.path).predict(run.data.test)
    message = str(refused.value)
    assert message.startswith(f"{path}: ") and reason in message, message
    assert f"probtrans evaluate {run.path} fits them again" in message
    assert main(["evaluate", str(run.path), "--quiet"]) == 0
    columns = Run.load(run.path).predict(run.data.test)
    assert set(FEATURE_SCORES) <= set(columns)


def test_knn_neighbours_above_the_training_rows_is_refused_unless_left_at_its_default():
    """A k chosen above the training rows is refused (the k-NN score would be the distance to
    the farthest feature); the default k, however the spec was built, is taken down to them."""
    from types import SimpleNamespace

    from probtrans.errors import ConfigError
    from probtrans.runs.fitting import check_knn_neighbours
    from probtrans.specs import PredictiveSpec

    data = SimpleNamespace(train=range(36), name="train.csv")
    check_knn_neighbours(PredictiveSpec(), data)
    check_knn_neighbours(PredictiveSpec.model_validate(PredictiveSpec().model_dump()), data)
    check_knn_neighbours(PredictiveSpec(knn_neighbours=36), data)
    check_knn_neighbours(PredictiveSpec(knn_neighbours=37, feature_scores=False), data)
    with pytest.raises(ConfigError, match="knn_neighbours = 37: above the 36 training rows of"):
        check_knn_neighbours(PredictiveSpec(knn_neighbours=37), data)
