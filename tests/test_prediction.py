"""Prediction columns, the input files of ``probtrans predict`` and its output files.

The end-to-end test of ``probtrans predict`` on a run folder lives with ``Run.predict``; here the
command is only checked up to the point where it loads the run."""

from __future__ import annotations

import csv
import gzip
import io
import json
import sys

import numpy as np
import pytest
from scipy.stats import entropy as scipy_entropy

from probtrans.cli import main
from probtrans.errors import ProbtransError
from probtrans.prediction import (
    format_predictions,
    prediction_columns,
    read_inputs,
    write_predictions,
)

# Two posterior samples of three inputs over three classes: input 0 the samples agree (a point
# mass of the posterior), input 1 they disagree, input 2 both are uniform.
PROBS = np.array(
    [
        [[0.7, 0.2, 0.1], [0.9, 0.05, 0.05], [1 / 3, 1 / 3, 1 / 3]],
        [[0.7, 0.2, 0.1], [0.1, 0.85, 0.05], [1 / 3, 1 / 3, 1 / 3]],
    ]
)
NAMES = ["cat", "dog", "owl"]


def test_columns_in_order_against_independent_values():
    columns = prediction_columns(PROBS, NAMES)
    assert list(columns) == [
        "predicted",
        "p_cat",
        "p_dog",
        "p_owl",
        "entropy",
        "expected_entropy",
        "mutual_information",
        "std_top",
    ]
    assert all(len(v) == 3 for v in columns.values())
    mean = PROBS.mean(axis=0)
    assert columns["predicted"][:2].tolist() == ["cat", "cat"]  # mean of input 1: .5, .45, .05
    for c, name in enumerate(NAMES):
        np.testing.assert_allclose(columns[f"p_{name}"], mean[:, c])
    total = scipy_entropy(mean, axis=1)  # natural logarithm
    expected = scipy_entropy(PROBS, axis=2).mean(axis=0)
    np.testing.assert_allclose(columns["entropy"], total)
    np.testing.assert_allclose(columns["expected_entropy"], expected)
    np.testing.assert_allclose(columns["mutual_information"], total - expected, atol=1e-12)
    # the point mass and the uniform input: no disagreement, no mutual information
    np.testing.assert_allclose(columns["mutual_information"][[0, 2]], 0.0, atol=1e-12)
    assert columns["mutual_information"][1] > 0.3
    np.testing.assert_allclose(columns["entropy"][2], np.log(3))
    # std over the two samples of the top class's probability: |a − b| / 2
    np.testing.assert_allclose(columns["std_top"], [0.0, abs(0.9 - 0.1) / 2, 0.0], atol=1e-12)


def test_mutual_information_is_clipped_at_zero():
    probs = np.full((4, 2, 2), 0.5)
    probs[:, 1] = [0.3, 0.7]
    columns = prediction_columns(probs, ["a", "b"])
    assert (columns["mutual_information"] >= 0).all()
    np.testing.assert_allclose(columns["entropy"], scipy_entropy([[0.5, 0.5], [0.3, 0.7]], axis=1))


def test_entropy_percentile_and_labels():
    reference = np.array([0.0, 0.2, 0.5, 0.9, 1.2])
    columns = prediction_columns(PROBS, NAMES, reference, labels=np.array([0, -1, 2]))
    assert list(columns)[-2:] == ["entropy_percentile", "label"]
    total = scipy_entropy(PROBS.mean(axis=0), axis=1)
    expected = [100 * np.mean(reference <= h) for h in total]
    np.testing.assert_allclose(columns["entropy_percentile"], expected)
    assert columns["entropy_percentile"][2] == 80.0  # log 3 ≈ 1.10 ≥ 4 of 5
    assert columns["label"].tolist() == ["cat", "", "owl"]
    own = prediction_columns(PROBS[:, :1], NAMES)["entropy"]
    at_reference = prediction_columns(PROBS[:, :1], NAMES, reference_entropy=own)
    assert at_reference["entropy_percentile"].tolist() == [100.0]  # ≤ counts itself


@pytest.mark.parametrize(
    "probs, names, kwargs, message",
    [
        (PROBS[0], NAMES, {}, "probs must be 3-D"),
        (PROBS, NAMES[:2], {}, "class_names has 2 names but probs has 3 classes"),
        (PROBS, ["a", "a", "b"], {}, "class_names must be distinct"),
        (PROBS, NAMES, {"reference_entropy": np.array([])}, "reference_entropy must not be empty"),
        (PROBS, NAMES, {"labels": np.array([0, 1])}, r"labels must be integers of shape \(3,\)"),
        (PROBS, NAMES, {"labels": np.array([0.0, 1, 2])}, "labels must be integers"),
        (PROBS, NAMES, {"labels": np.array([0, 3, 1])}, r"labels must lie in -1..2"),
    ],
)
def test_column_errors(probs, names, kwargs, message):
    with pytest.raises(ValueError, match=message):
        prediction_columns(probs, names, **kwargs)


# ----------------------------------------------------------------------------- inputs
TEXTS = ["A fine film, truly.", 'He said "no".', "Ünïcode ✓"]


def test_read_texts_from_stdin_and_txt(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(["", *TEXTS, "  ", ""])))
    assert read_inputs("-", "tokens") == TEXTS
    path = tmp_path / "in.txt"
    path.write_text("\n".join([TEXTS[0], "", TEXTS[1], "   ", TEXTS[2]]) + "\n", encoding="utf-8")
    assert read_inputs(str(path), "tokens") == TEXTS


def test_read_texts_from_tables(tmp_path):
    csv_path = tmp_path / "in.csv"
    with open(csv_path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "text"])
        writer.writerows([[i, text] for i, text in enumerate(TEXTS)])
    assert read_inputs(str(csv_path), "tokens") == TEXTS
    tsv_path = tmp_path / "in.tsv"
    tsv_path.write_text("text\tid\n" + "".join(f"{t}\t{i}\n" for i, t in enumerate(TEXTS)))
    assert read_inputs(str(tsv_path), "tokens") == TEXTS  # quotes kept: tabs only
    rows = "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(TEXTS))
    jsonl = tmp_path / "in.jsonl"
    jsonl.write_text(rows + "\n")  # a trailing blank line is skipped
    assert read_inputs(str(jsonl), "tokens") == TEXTS
    gz = tmp_path / "in.jsonl.gz"
    gz.write_bytes(gzip.compress(rows.encode()))
    assert read_inputs(str(gz), "tokens") == TEXTS


def test_read_images(tmp_path):
    x = np.random.default_rng(0).random((5, 8, 8))
    np.savez(tmp_path / "three.npz", x=x)
    np.savez(tmp_path / "four.npz", x=x[:, None], other=np.zeros(2))
    for name in ("three", "four"):
        read = read_inputs(str(tmp_path / f"{name}.npz"), "image")
        assert read.dtype == np.float32 and read.shape[0] == 5
        np.testing.assert_allclose(read.reshape(5, 8, 8), x, rtol=1e-6)


def _write(path, content):
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return str(path)


INPUT_ERRORS = [
    ("missing.txt", None, "tokens", "missing.txt: no such file"),
    ("in.pdf", "text", "tokens", "in.pdf: unknown extension '.pdf'; texts (or '-' for standard"),
    ("in", "text", "tokens", "in: unknown extension '(none)'"),
    ("in.txt", "x", "image", "in.txt: unknown extension '.txt'; images (an array 'x') are read "),
    ("in.txt", "\n  \n", "tokens", "in.txt: no texts to predict"),
    ("in.txt", b"fine\n\xff\xfe\n", "tokens", "in.txt:2: not valid UTF-8"),
    ("in.csv", "", "tokens", "in.csv: empty file (no header with a 'text' column)"),
    ("in.csv", "sentence,id\nfine,1\n", "tokens", "in.csv:1: no 'text' column in the header"),
    (
        "in.tsv",
        "id\tsentence\n1\tfine\n",
        "tokens",
        "in.tsv:1: no 'text' column in the header (columns: 'id', 'sentence')",
    ),
    ("in.csv", "text\n", "tokens", "in.csv: no texts to predict"),
    ("in.csv", "id,text\n1,fine\n2,\n", "tokens", "in.csv:3: empty 'text'"),
    ("in.csv", "id,text\n1,fine\n2\n", "tokens", "in.csv:3: empty 'text'"),
    ("in.csv", b"text\n\xff\n", "tokens", "in.csv: not valid UTF-8"),
    ("in.jsonl", '{"text": "fine"}\n{"text": "ok"\n', "tokens", "in.jsonl:2: not a JSON object"),
    (
        "in.jsonl",
        '{"text": "fine"}\n["fine"]\n',
        "tokens",
        "in.jsonl:2: not a JSON object (a list)",
    ),
    ("in.jsonl", '{"text": "a"}\n{"sentence": "b"}\n', "tokens", "in.jsonl:2: no 'text' key (keys"),
    ("in.jsonl", '{"text": 3}\n', "tokens", "in.jsonl:1: 'text' is a int, not a string"),
    ("in.jsonl", "\n\n", "tokens", "in.jsonl: no texts to predict"),
    ("in.jsonl.gz", b"not gzip", "tokens", "in.jsonl.gz: not a readable gzip file"),
    ("in.npz", b"not a zip", "image", "in.npz: not a readable .npz file"),
]


@pytest.mark.parametrize("name, content, kind, message", INPUT_ERRORS)
def test_input_errors(tmp_path, name, content, kind, message):
    source = str(tmp_path / name) if content is None else _write(tmp_path / name, content)
    with pytest.raises(ProbtransError) as err:
        read_inputs(source, kind)
    text = str(err.value)
    assert text.startswith(str(tmp_path)) and message in text, text
    assert "\n" not in text


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"images": np.zeros((2, 4, 4))}, "no array 'x' (arrays: 'images')"),
        (
            {"x": np.zeros((2, 16))},
            "array 'x' has shape (2, 16); images are (N, H, W) or (N, C, H, W)",
        ),
        ({"x": np.zeros((0, 4, 4))}, "array 'x' holds no images (shape (0, 4, 4))"),
        ({"x": np.array([[["a"]]])}, "array 'x' has dtype <U1, not numbers"),
    ],
)
def test_image_input_errors(tmp_path, arrays, message):
    path = tmp_path / "in.npz"
    np.savez(path, **arrays)
    with pytest.raises(ProbtransError) as err:
        read_inputs(str(path), "image")
    assert str(err.value) == f"{path}: {message}"


def test_stdin_errors(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n \n"))
    with pytest.raises(ProbtransError, match="^standard input: no texts to predict$"):
        read_inputs("-", "tokens")
    with pytest.raises(ProbtransError, match="^standard input: images are read from an .npz"):
        read_inputs("-", "image")
    with pytest.raises(ValueError, match="kind must be 'tokens' or 'image'"):
        read_inputs("-", "audio")


# ----------------------------------------------------------------------------- outputs
def columns_with_labels() -> dict[str, np.ndarray]:
    return prediction_columns(PROBS, NAMES, np.array([0.1, 0.5]), np.array([1, -1, 0]))


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
def test_write_and_read_back_a_table(tmp_path, suffix):
    columns = columns_with_labels()
    out = write_predictions(columns, tmp_path / f"sub/pred{suffix}")
    assert out == tmp_path / f"sub/pred{suffix}"
    with open(out, newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh, delimiter="," if suffix == ".csv" else "\t"))
    assert list(rows[0]) == list(columns) and len(rows) == 3
    for name, values in columns.items():
        read = [row[name] for row in rows]
        if values.dtype.kind == "f":
            assert [float(v) for v in read] == values.tolist()  # full precision
        else:
            assert read == values.tolist()
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary file left


def test_write_and_read_back_json_lines(tmp_path):
    columns = columns_with_labels()
    out = write_predictions(columns, tmp_path / "pred.jsonl")
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 3 and list(rows[0]) == list(columns)
    for name, values in columns.items():
        assert [row[name] for row in rows] == values.tolist()


def test_write_errors(tmp_path):
    with pytest.raises(ProbtransError, match=r"pred\.txt: unknown extension '\.txt'; predictions"):
        write_predictions(columns_with_labels(), tmp_path / "pred.txt")
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises((ProbtransError, OSError)):
        write_predictions(columns_with_labels(), blocker / "pred.csv")
    with pytest.raises(ValueError, match="columns must be 1-D of one length"):
        write_predictions({"a": np.zeros(2), "b": np.zeros(3)}, tmp_path / "x.csv")


def test_table_on_stdout(capsys):
    probs = np.tile(PROBS[:, :1], (1, 25, 1))
    assert write_predictions(prediction_columns(probs, NAMES)) is None
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == list(prediction_columns(PROBS, NAMES))
    assert len(lines) == 1 + 20 + 1 and lines[-1] == "… and 5 more rows (of 25)"
    assert lines[1].split()[:3] == ["cat", "0.7000", "0.2000"]
    short = format_predictions(prediction_columns(PROBS, NAMES)).splitlines()
    assert len(short) == 4 and short[3].split()[-1] == "0.0000"  # std_top of the uniform input


# ----------------------------------------------------------------------------- the command
@pytest.mark.parametrize(
    "argv, message",
    [
        (["--samples", "0"], "error: --samples 0: must be > 0"),
        (["--out", "pred.txt"], "error: --out pred.txt: must end in .csv, .tsv, .jsonl"),
    ],
)
def test_predict_command_checks_options_first(tmp_path, capsys, argv, message):
    source = tmp_path / "in.txt"
    source.write_text("fine\n")
    assert main(["predict", str(tmp_path / "no-run"), str(source), *argv]) == 2
    assert capsys.readouterr().err.strip() == message


def test_predict_command_missing_input_or_run(tmp_path, capsys):
    assert main(["predict", str(tmp_path), str(tmp_path / "none.txt")]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'none.txt'}: no such file"
    source = tmp_path / "in.txt"
    source.write_text("fine\n")
    assert main(["predict", str(tmp_path / "no-run"), str(source)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'no-run'}: no such run folder"


def test_predict_is_listed_in_help(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    assert "predict" in capsys.readouterr().out
