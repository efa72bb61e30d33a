"""Your own text files from fit to predict and evaluate on the command line, and a run folder
that answers with nothing else: its data files, the data folder and the cache gone."""

from __future__ import annotations

import csv
import io
import json
import shutil
import subprocess
import sys

import numpy as np
import pandas
import pytest

from probtrans.analysis import metrics
from probtrans.analysis.feature_scores import FEATURE_SCORES
from probtrans.cli import main
from tests.conftest import ROOT, TINY_MODEL

POSITIVE = ["good", "great", "fine", "lovely", "superb"]
NEGATIVE = ["bad", "awful", "poor", "dull", "broken"]
FILLER = ["the", "movie", "plot", "was", "really", "quite", "acting", "and", "story", "very"]


def sentences(n: int, seed: int) -> list[tuple[str, str]]:
    """n (text, label) rows: a few filler words around one or two words of the label's list."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        label = "pos" if i % 2 else "neg"
        words = list(rng.choice(FILLER, size=4)) + list(
            rng.choice(POSITIVE if label == "pos" else NEGATIVE, size=2)
        )
        rng.shuffle(words)
        rows.append((" ".join(words), label))
    return rows


def write_tsv(path, rows, header=("text", "label")) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = ["\t".join(header)] + ["\t".join(row) for row in rows]
    path.write_text("\n".join(lines) + "\n")


MODEL = (
    """
[data]
kind = "text"
train = "data/train.tsv"
validation = "data/dev.tsv"
labels = ["neg", "pos"]
max_len = 16

[[data.ood]]
name = "questions"
source = "data/questions.jsonl"

"""
    + "[model]"
    + TINY_MODEL.split("[model]", 1)[1]
)  # the tiny network of the digits tests

INFERENCE = (
    (ROOT / "inference" / "map.toml").read_text().split("[train]")[0]
    + """
[train]
epochs = 3
batch_size = 16
val_samples = 2

[predictive]
samples = 4
"""
)


@pytest.fixture
def project(tmp_path):
    """A spec folder with its data files, inputs to predict elsewhere, and a fitted run."""
    spec_dir = tmp_path / "project"
    write_tsv(spec_dir / "data" / "train.tsv", sentences(80, 0))
    write_tsv(spec_dir / "data" / "dev.tsv", sentences(20, 1))
    questions = ["why is the sky blue", "where do birds go", "how old is the moon"]
    (spec_dir / "data" / "questions.jsonl").write_text(
        "".join(json.dumps({"text": q}) + "\n" for q in questions)
    )
    (spec_dir / "model.toml").write_text(MODEL)
    (spec_dir / "inference.toml").write_text(INFERENCE)
    inputs = tmp_path / "inputs"
    write_tsv(inputs / "reviews.tsv", sentences(10, 2))
    (inputs / "a.csv").write_text("text\nis it raining\nwhat time is it\nwho wrote this\n")
    (inputs / "b.jsonl").write_text(
        "".join(json.dumps({"text": t, "label": lab}) + "\n" for t, lab in sentences(6, 3))
    )
    run = tmp_path / "run"
    model, inference = spec_dir / "model.toml", spec_dir / "inference.toml"
    assert (
        main(["fit", str(model), "--inference", str(inference), "--out", str(run), "--quiet"]) == 0
    )
    return spec_dir, inputs, run


def read_csv(path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_fit_predict_and_evaluate_on_your_own_text_files(project, capsys, tmp_path, monkeypatch):
    spec_dir, inputs, run = project
    monkeypatch.chdir(tmp_path)  # the spec's paths are its folder's, not the working folder's
    written = json.loads((run / "metrics.json").read_text())
    assert set(written["ood"]) == {"questions"} and written["ood"]["questions"]["n"] == 3
    assert (run / "tokenizer.json").is_file() and (run / "data.json").is_file()

    out = tmp_path / "predictions.csv"
    capsys.readouterr()
    argv = ["predict", str(run), str(inputs / "reviews.tsv"), "--out", str(out), "--labels"]
    assert main(argv) == 0
    rows = read_csv(out)
    assert len(rows) == 10
    assert list(rows[0]) == [
        "text",
        "predicted",
        "p_neg",
        "p_pos",
        "entropy",
        "expected_entropy",
        "mutual_information",
        "std_top",
        *(f"{name}{part}" for name in FEATURE_SCORES for part in ("", "_percentile")),
        "entropy_percentile",
        "label",
    ]
    truth = [label for _, label in sentences(10, 2)]
    assert [row["label"] for row in rows] == truth
    assert [row["text"] for row in rows] == [text for text, _ in sentences(10, 2)]
    for row in rows:
        p = np.array([float(row["p_neg"]), float(row["p_pos"])])
        assert p.sum() == pytest.approx(1.0, abs=1e-6)
        assert row["predicted"] == ["neg", "pos"][int(p.argmax())]
        assert float(row["entropy"]) == pytest.approx(float(metrics._entropy(p)), abs=1e-6)
        assert 0.0 <= float(row["entropy_percentile"]) <= 100.0

    capsys.readouterr()
    a, b = str(inputs / "a.csv"), str(inputs / "b.jsonl")
    assert main(["evaluate", str(run), "--ood", f"a={a}", "--ood", f"b={b}", "--quiet"]) == 0
    printed = capsys.readouterr().out
    scores = json.loads((run / "metrics.json").read_text())
    assert set(scores["ood"]) == {"questions", "a", "b"}
    for name in ("questions", "a", "b"):
        for score in metrics.UNCERTAINTY_SCORES:
            result = scores["ood"][name][score]
            assert set(result) == {"auroc", "aupr", "fpr95"}
            assert all(0.0 <= v <= 1.0 for v in result.values())
        for measure in ("auroc", "aupr", "fpr95"):
            row = next(line for line in printed.splitlines() if line.split()[:2] == [name, measure])
            assert len(row.split()) == 2 + len(metrics.UNCERTAINTY_SCORES)
    assert scores["ood"]["b"]["n"] == 6 and "accuracy" in scores["ood"]["b"]  # b has labels
    assert "accuracy" not in scores["ood"]["a"]
    assert "b (labelled, n = 6): accuracy" in printed
    again = str(inputs / "b.jsonl")  # the same name again replaces the set: the same numbers
    assert main(["evaluate", str(run), "--ood", f"b={again}", "--quiet"]) == 0
    assert json.loads((run / "metrics.json").read_text())["ood"] == scores["ood"]

    capsys.readouterr()  # a bad set name, a bad source: one error line, exit 2, nothing changed
    before = (run / "metrics.json").read_bytes()
    assert main(["evaluate", str(run), "--ood", "no name"]) == 2
    assert main(["evaluate", str(run), "--ood", f"c={inputs / 'missing.tsv'}"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and "NAME=SOURCE" in errors[0] and "missing.tsv" in errors[1]
    assert (run / "metrics.json").read_bytes() == before


def test_predict_reads_and_writes_a_text_file_a_chunk_at_a_time(project, tmp_path, monkeypatch):
    """Without ``--labels`` a text file is read, predicted and written 4 rows at a time: the
    file equals the one written from the whole input (``--labels``: read whole), and a bad
    row in the last chunk stops it with the whole read's message before anything is
    written."""
    import probtrans.runs.run

    _, inputs, run = project
    monkeypatch.setattr(probtrans.runs.run, "PREDICT_CHUNK_ROWS", 4)
    source = inputs / "reviews.tsv"
    streamed, whole = tmp_path / "streamed.csv", tmp_path / "whole.csv"
    assert main(["predict", str(run), str(source), "--out", str(streamed), "--quiet"]) == 0
    argv = ["predict", str(run), str(source), "--out", str(whole), "--quiet", "--labels"]
    assert main(argv) == 0
    with_labels = read_csv(whole)
    assert read_csv(streamed) == [{k: v for k, v in r.items() if k != "label"} for r in with_labels]
    bad = tmp_path / "bad.csv"
    bad.write_text("text\n" + "".join(f"row {i}\n" for i in range(9)) + '"\n')  # an empty text
    assert main(["predict", str(run), str(bad), "--out", str(tmp_path / "no.csv")]) == 2
    assert not (tmp_path / "no.csv").exists()


def test_predict_notes_the_texts_cut_at_the_runs_max_len(project, tmp_path, monkeypatch, capsys):
    """A text longer than the run's ``data.max_len`` (16) is predicted from its first 16 tokens:
    predict says how many inputs fill all of them, read a chunk at a time or whole
    (``--labels``), even with ``--quiet``; inputs that fit get no note."""
    import probtrans.runs.run

    _, inputs, run = project
    monkeypatch.setattr(probtrans.runs.run, "PREDICT_CHUNK_ROWS", 2)
    rows = sentences(5, 4)
    rows[1] = (" ".join(["the movie was really good"] * 4), "pos")  # 20 words
    rows[4] = (" ".join(["very"] * 16), "neg")  # exactly 16: fills them all
    long = inputs / "long.tsv"
    write_tsv(long, rows)
    expected = (
        f"note: {long}: 2 of 5 texts (40.0 %) fill all data.max_len = 16 tokens of the run; "
        f"those longer were predicted from their first 16 tokens"
    )
    for labels in ([], ["--labels"]):
        out = tmp_path / f"long{len(labels)}.csv"
        assert main(["predict", str(run), str(long), "--out", str(out), "--quiet", *labels]) == 0
        assert capsys.readouterr().err.strip().splitlines() == [expected]
    out = tmp_path / "short.csv"
    assert (
        main(["predict", str(run), str(inputs / "reviews.tsv"), "--out", str(out), "--quiet"]) == 0
    )
    assert "max_len" not in capsys.readouterr().err


def test_a_malformed_input_to_predict_is_one_line_on_the_standard_error(project, tmp_path):
    """``probtrans predict`` in a process of its own on a CSV with a ragged row: exit 2 and the
    one ``error:`` line naming the file and line, nothing else on the standard error
    (``datasets`` logged its streamed read's failure there too)."""
    _, _, run = project
    ragged = tmp_path / "ragged.csv"
    ragged.write_text("text\nthe plot was fine\nthe plot, again\n")
    argv = [sys.executable, "-m", "probtrans", "predict", str(run), str(ragged), "--quiet"]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"error: {ragged}:3: 2 fields where the header has 1"]


def test_a_copied_run_answers_without_its_data_or_cache(project, tmp_path, monkeypatch, capsys):
    spec_dir, inputs, run = project
    reviews = str(inputs / "reviews.tsv")
    original = tmp_path / "original.jsonl"
    assert main(["predict", str(run), reviews, "--out", str(original), "--quiet"]) == 0

    elsewhere = tmp_path / "elsewhere" / "run"
    shutil.copytree(run, elsewhere)
    shutil.rmtree(spec_dir / "data")  # the training files are gone
    monkeypatch.delenv("PROBTRANS_DATA_DIR", raising=False)
    monkeypatch.setenv("PROBTRANS_CACHE_DIR", str(tmp_path / "empty-cache"))
    copied = tmp_path / "copied.jsonl"
    assert main(["predict", str(elsewhere), reviews, "--out", str(copied), "--quiet"]) == 0
    assert copied.read_text() == original.read_text()  # the same probabilities, to the digit

    metrics_before = json.loads((elsewhere / "metrics.json").read_text())
    assert main(["evaluate", str(elsewhere), "--quiet"]) == 0
    again = json.loads((elsewhere / "metrics.json").read_text())
    assert again["accuracy"] == metrics_before["accuracy"]
    assert again["ood"] == metrics_before["ood"]

    monkeypatch.setattr(sys, "stdin", io.StringIO("a really good movie\n\nan awful plot\n"))
    assert main(["predict", str(elsewhere), "-", "--quiet"]) == 2  # rows must stay lines
    assert "standard input:2: an empty line" in capsys.readouterr().err
    monkeypatch.setattr(sys, "stdin", io.StringIO("a really good movie\nan awful plot\n\n"))
    assert main(["predict", str(elsewhere), "-", "--quiet"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:4] == ["text", "predicted", "p_neg", "p_pos"] and len(table) == 3
    assert table[1].startswith("a really good movie")


def test_the_command_line_refuses_what_would_lose_or_confuse_data(project, capsys, monkeypatch):
    import os

    import probtrans
    import probtrans.runs.run as run_module

    spec_dir, inputs, run = project
    reviews = inputs / "reviews.tsv"
    before = reviews.read_bytes()
    assert main(["predict", str(run), str(reviews), "--out", str(reviews)]) == 2
    assert reviews.read_bytes() == before  # the input is not overwritten by its predictions
    a = str(inputs / "a.csv")
    assert main(["evaluate", str(run), "--ood", f"x={a}", "--ood", f"x={a}"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert "is the input" in errors[0] and "'x' is given twice" in errors[1]
    mask = os.umask(0o022)
    os.umask(mask)
    for path in run.iterdir():  # run files are created as open() would, not private
        assert path.stat().st_mode & 0o777 == 0o666 & ~mask, path.name
    loaded = probtrans.Run.load(run)
    with pytest.raises(probtrans.errors.ProbtransError, match="nothing to predict"):
        loaded.predict([])
    with pytest.raises(probtrans.errors.ProbtransError, match="not one string"):
        loaded.predict("a good movie")
    texts = ["a good movie", "an awful plot"]
    expected = loaded.predict(texts, samples=2)["p_pos"]
    table = pandas.DataFrame({"id": [3, 4], "text": texts})  # the run's text column, by name
    for given in (np.array(texts), np.array(texts, dtype=object), pandas.Series(texts), table):
        np.testing.assert_array_equal(loaded.predict(given, samples=2)["p_pos"], expected)
    with pytest.raises(probtrans.errors.ProbtransError, match=r"text 1 is missing \(NaN\)"):
        loaded.predict(pandas.Series(["a good movie", None]))
    monkeypatch.setattr(run_module, "PREDICT_CHUNK_ROWS", 4)  # a bad text in the third chunk
    with pytest.raises(probtrans.errors.ProbtransError, match=r"text 9 is a int, not a string"):
        loaded.predict([*texts * 4, "fine", 7])


def test_integer_labels_are_no_classes_of_a_run_of_string_labels(project, tmp_path, capsys):
    _, inputs, run = project
    numbered = tmp_path / "numbered.csv"
    numbered.write_text("text,label\na good movie,1\n")  # the run's classes are "neg", "pos"
    assert main(["predict", str(run), str(numbered), "--quiet", "--labels"]) == 2
    assert "numbered.csv:2: label 1 is not one of the classes ['neg', 'pos']" in (
        capsys.readouterr().err
    )
    # unasked, the label column (another task's, say) is ignored: predict needs no labels
    assert main(["predict", str(run), str(numbered), "--quiet"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:2] == ["text", "predicted"] and "label" not in table[0].split()
    unlabelled = tmp_path / "unlabelled.csv"
    unlabelled.write_text("text\na good movie\n")
    assert main(["predict", str(run), str(unlabelled), "--quiet", "--labels"]) == 2
    assert "--labels: no label column 'label'" in capsys.readouterr().err
