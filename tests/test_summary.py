"""Tests of probtrans.analysis.summary's metrics.json rows: the torch-uncertainty names and missing
values, and of the run table that ``fit`` and ``evaluate`` print."""

from __future__ import annotations

import json

import numpy as np

from probtrans.analysis import metrics, report, summary


def predictive(samples: int = 6, seed: int = 0) -> tuple[dict, dict]:
    """probs and labels of val, test, an unlabelled set "noise" and a labelled set "shifted";
    flat Dirichlet draws with random labels (accuracy about 1/4: no coverage has 5 % risk)."""
    rng = np.random.default_rng(seed)
    sizes = {"val": 60, "test": 80, "ood:noise": 30, "ood:shifted": 40}
    probs = {s: rng.dirichlet(np.ones(4), size=(samples, n)) for s, n in sizes.items()}
    labels = {s: rng.integers(0, 4, n) for s, n in sizes.items()}
    labels["ood:noise"] = np.full(30, -1)
    return probs, labels


def torch_uncertainty_names() -> dict[str, str]:
    """Our key → torch-uncertainty's name, of every metric that has one."""
    return {m.name: m.torch_uncertainty for m in summary.torch_uncertainty_metrics()}


def test_the_alias_mapping_names_only_keys_that_exist():
    probs, labels = predictive()
    keys = metrics.classification_metrics(probs["test"], labels["test"])
    assert set(torch_uncertainty_names()) <= set(keys)
    assert summary.OOD_SCORE in metrics.UNCERTAINTY_SCORES
    assert set(summary.TORCH_UNCERTAINTY_OOD) <= {"auroc", "aupr", "fpr95"}
    names = list(torch_uncertainty_names().values())
    assert len(set(names)) == len(names)


def test_the_docstring_table_of_torch_uncertainty_names_is_the_registry():
    """The table of summary's docstring pairs exactly the registered torch-uncertainty names."""
    lines = summary.__doc__.splitlines()
    rules = [i for i, line in enumerate(lines) if line.startswith("====")]
    body = lines[rules[1] + 1 : rules[2]]  # between the rule under the header and the last
    cells = [cell.strip("`") for line in body for cell in line.split()]
    documented = dict(zip(cells[0::2], cells[1::2], strict=True))
    assert documented == torch_uncertainty_names()


def test_torch_uncertainty_names_are_grouped_in_metrics_json():
    """metrics.json keeps the order it had: by group (cls, cal, sc, ens), then as METRICS."""
    assert list(torch_uncertainty_names().values()) == [
        "cls/Acc",
        "cls/NLL",
        "cls/Brier",
        "cls/Entropy",
        "cal/ECE",
        "cal/aECE",
        "sc/AURC",
        "sc/AUGRC",
        "sc/Cov@5Risk",
        "sc/Risk@80Cov",
        "ens_MI",
        "ens_Disagreement",
    ]


def test_summarise_repeats_the_metrics_under_torch_uncertainty_names():
    probs, labels = predictive()
    scores = summary.summarise(probs, labels)
    block = scores["torch_uncertainty"]
    for key, name in torch_uncertainty_names().items():
        assert block[f"test/{name}"] == scores[key], key
    scaled = [m.name for m in metrics.METRICS.entries() if m.temperature_scaled]
    assert [k for k in scores if k.startswith("ts_")] == [f"ts_{k}" for k in scaled]
    for key in scaled:
        name = torch_uncertainty_names().get(key)
        assert name is None or block[f"test/post/{name}"] == scores[f"ts_{key}"]
    assert "test/post/cls/Acc" not in block  # temperature scaling has no accuracy of its own
    for set_name in ("noise", "shifted"):
        assert block[f"ood/{set_name}/AUROC"] == scores["ood"][set_name]["msp"]["auroc"]
        assert block[f"ood/{set_name}/AUPR"] == scores["ood"][set_name]["msp"]["aupr"]
    assert block["shift/shifted/cls/Acc"] == scores["ood"]["shifted"]["accuracy"]
    assert block["shift/shifted/cal/ECE"] == scores["ood"]["shifted"]["ece"]
    assert not any(name.startswith("shift/noise/") for name in block)  # no labels, no shift
    assert not any("FPR95" in name for name in block)  # another positive class: no alias


def test_a_metric_without_value_is_null_and_metrics_json_is_strict_json():
    probs, labels = predictive()
    scores = summary.summarise(probs, labels)
    assert scores["cov_at_5_risk"] is None  # random labels: no coverage has 5 % risk
    assert scores["torch_uncertainty"]["test/sc/Cov@5Risk"] is None
    assert json.loads(json.dumps(scores, allow_nan=False)) == scores


def test_one_sample_has_no_disagreement():
    probs, labels = predictive(samples=1)
    scores = summary.summarise(probs, labels)
    assert "disagreement" not in scores
    assert "test/ens_Disagreement" not in scores["torch_uncertainty"]


def run_metrics() -> dict:
    """A run's metrics.json with two post-hoc variants and the run information."""
    probs, labels = predictive()
    scores = summary.summarise(probs, labels)
    for variant in ("laplace", "mc_dropout"):
        variant_scores = summary.summarise(*predictive(seed=1))
        scores |= {f"{variant}.{key}": value for key, value in variant_scores.items()}
    return scores | {"posterior_samples": 6, "best_epoch": 7, "epochs": 40, "seed": 0}


def test_run_table_shows_every_predictive_and_headline_metric_in_100_columns():
    scores = run_metrics()
    lines = report.format_run_table(scores, summary.headline()).splitlines()
    assert lines[0].split() == ["metric", "plain", "temperature-scaled", "laplace", "mc_dropout"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:-1]}
    assert list(rows) == summary.headline()
    assert rows["aece"] == [f"{scores[k]:.4f}" for k in ("aece", "ts_aece")] + [
        f"{scores[f'{v}.aece']:.4f}" for v in ("laplace", "mc_dropout")
    ]
    assert rows["cov_at_5_risk"] == ["–"] * 4  # none attained, no temperature-scaled value
    assert rows["test_elpd"][0] == f"{scores['test_elpd']:.4f}" and rows["test_elpd"][1] == "–"
    assert lines[-1] == "weights of epoch 7 of 40 (best validation), 6 posterior samples"
    assert max(len(line) for line in lines) <= 100


def test_run_table_leaves_out_keys_no_predictive_has():
    scores = {"accuracy": 0.9, "nll": float("nan"), "ts_nll": 0.3}
    lines = report.format_run_table(scores, ["accuracy", "nll", "test_elpd"]).splitlines()
    assert [line.split()[0] for line in lines] == ["metric", "accuracy", "nll"]
    assert lines[2].split() == ["nll", "–", "0.3000"]


def test_headline_keys_are_metrics_json_keys():
    probs, labels = predictive()
    assert set(summary.headline()) <= set(summary.summarise(probs, labels))
    assert summary.headline()[-1] == "test_elpd"


def test_a_predictive_that_gives_one_class_to_the_whole_validation_split_gets_a_note():
    rng = np.random.default_rng(0)
    draws = rng.dirichlet([1, 1, 1], size=(4, 50))  # (S, N, C)
    constant = draws.copy()
    constant[..., 2] += 5.0  # class 2 the most probable everywhere, on average over draws
    constant /= constant.sum(-1, keepdims=True)
    note = summary.constant_note({"val": constant, "test": draws}, ["a", "b", "c"])
    assert note is not None and "50 validation examples is predicted 'c'" in note
    assert summary.constant_note({"val": constant}, []).count("class 2") == 1
    assert summary.constant_note({"val": draws, "test": constant}, ["a", "b", "c"]) is None
    one_draw_differs = constant.copy()
    one_draw_differs[0, 0] = [1.0, 0.0, 0.0]  # averaged over the draws: still class 2
    assert summary.constant_note({"val": one_draw_differs}, []) is not None


def test_fit_and_evaluate_end_with_a_warning_for_each_constant_predictive(capsys):
    from probtrans.cli import warn_constant

    note = "every one of the 9 validation examples is predicted 'x'"
    warn_constant({"accuracy": 0.5, "mc_dropout.accuracy": 0.5, "mc_dropout.constant_note": note})
    assert capsys.readouterr().err == f"warning: the mc_dropout predictive: {note}\n"
    warn_constant({"accuracy": 0.5, "constant_note": note})
    assert capsys.readouterr().err == f"warning: the plain predictive: {note}\n"
