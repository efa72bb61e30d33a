"""Prediction columns and the output files of ``probtrans predict``.

The input files are tested with :mod:`probtrans.data.files` (tests/test_data_files.py). The
end-to-end test of ``probtrans predict`` on a run folder lives with ``Run.predict``; here the
command is only checked up to the point where it loads the run."""

from __future__ import annotations

import csv
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from scipy.stats import entropy as scipy_entropy

from probtrans.cli import main
from probtrans.errors import ProbtransError
from probtrans.runs.prediction import (
    format_predictions,
    prediction_columns,
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
        (PROBS, NAMES, {"reference_entropy": np.array([])}, "reference values must not be empty"),
        (PROBS, NAMES, {"labels": np.array([0, 1])}, r"labels must be integers of shape \(3,\)"),
        (PROBS, NAMES, {"labels": np.array([0.0, 1, 2])}, "labels must be integers"),
        (PROBS, NAMES, {"labels": np.array([0, 3, 1])}, r"labels must lie in -1..2"),
    ],
)
def test_column_errors(probs, names, kwargs, message):
    with pytest.raises(ValueError, match=message):
        prediction_columns(probs, names, **kwargs)


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


def test_write_and_read_back_parquet(tmp_path):
    columns = columns_with_labels()
    out = write_predictions(columns, tmp_path / "pred.parquet")
    table = pq.read_table(out)
    assert table.column_names == list(columns) and table.num_rows == 3
    assert str(table.schema.field("predicted").type) == "string"
    assert str(table.schema.field("entropy").type) == "double"
    for name, values in columns.items():
        assert table.column(name).to_pylist() == values.tolist()  # full precision
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary file left


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".parquet"])
def test_a_table_written_in_chunks_is_the_table_written_whole(tmp_path, suffix):
    """``probtrans predict`` writes each chunk of rows as it is predicted: the file is byte for
    byte the one written from the whole table (Parquet: the same table read back), texts as
    Python strings or NumPy's, and a chunk that fails leaves the previous file as it was."""
    columns = columns_with_labels()
    columns = {"text": np.array(["a,b", 'say "hi"', "ünï\tcode"]), **columns}
    whole = write_predictions(columns, tmp_path / f"whole{suffix}")

    def chunks(fail: bool = False):
        for rows in (slice(0, 2), slice(2, 2), slice(2, 3)):
            if fail and rows.start == 2:
                raise ProbtransError("the second chunk failed")
            yield {
                name: np.array(values[rows], dtype=object if name == "text" else values.dtype)
                for name, values in columns.items()
            }

    chunked = write_predictions(chunks(), tmp_path / f"chunked{suffix}")
    if suffix == ".parquet":
        assert pq.read_table(chunked).equals(pq.read_table(whole))
    else:
        assert chunked.read_bytes() == whole.read_bytes()
    with pytest.raises(ProbtransError, match="the second chunk failed"):
        write_predictions(chunks(fail=True), chunked)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"chunked{suffix}", f"whole{suffix}"]
    assert write_predictions(chunks(), tmp_path / f"again{suffix}").read_bytes() == (
        chunked.read_bytes()
    )


def test_chunks_of_other_columns_are_refused(tmp_path):
    first = {"a": np.zeros(2), "b": np.ones(2)}
    with pytest.raises(ValueError, match=r"every chunk must have the columns \['a', 'b'\]"):
        write_predictions(iter([first, {"b": np.ones(1), "a": np.zeros(1)}]), tmp_path / "x.csv")
    with pytest.raises(ValueError, match="no columns to write"):
        write_predictions(iter([]), tmp_path / "x.csv")
    assert list(tmp_path.iterdir()) == []


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
        (["--samples", "0"], "error: --samples 0: must be a positive integer"),
        (["--out", "pred.txt"], "error: --out pred.txt: must end in .csv, .tsv, .jsonl, .parquet"),
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
