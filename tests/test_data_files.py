"""Reading a user's data (:mod:`probtrans.data.files`): text tables, .npz images, folders written
by ``datasets``' ``save_to_disk`` (standing in for hub ids), the inputs of ``probtrans predict``,
and the one-line errors naming the file and line of a malformed row. Every file is small and
written in ``tmp_path``; nothing reaches the hub."""

from __future__ import annotations

import csv
import gzip
import io
import json
import sys
import tempfile
from pathlib import Path

import datasets
import numpy as np
import pytest
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value
from datasets.utils import logging as datasets_logging
from PIL import Image

from probtrans.data.files import (
    HF_PREFIX,
    Rows,
    Source,
    input_text_chunks,
    parse_source,
    read_images,
    read_inputs,
    read_texts,
)
from probtrans.data.formats import formats, suffixes
from probtrans.data.rows import TextColumn
from probtrans.errors import ProbtransError

TEXTS = ["A fine film, truly.", 'He said "no".', "Ünïcode ✓"]


def _write(path: Path, content: str | bytes) -> Path:
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def _texts(path: Path, **options) -> Rows:
    return read_texts(parse_source(str(path)), **options)


def _error(read, *args, **options) -> str:
    """The one-line message of the ProbtransError that ``read(*args, **options)`` raises."""
    with pytest.raises(ProbtransError) as err:
        read(*args, **options)
    message = str(err.value)
    assert "\n" not in message, message
    return message


def _where(rows: Rows) -> list[str]:
    return [rows.where(i) for i in range(len(rows))]


# ----------------------------------------------------------------------------- sources
def test_parse_source_hub_strings():
    glue = parse_source("hf:nyu-mll/glue:cola@validation")
    assert (glue.path, glue.hub_id, glue.config, glue.split) == (
        None,
        "nyu-mll/glue",
        "cola",
        "validation",
    )
    assert str(glue) == "hf:nyu-mll/glue:cola@validation"
    imdb = parse_source("hf:stanfordnlp/imdb@test")
    assert (imdb.hub_id, imdb.config, imdb.split) == ("stanfordnlp/imdb", None, "test")
    plain = parse_source("hf:stanfordnlp/imdb")
    assert (plain.hub_id, plain.config, plain.split) == ("stanfordnlp/imdb", None, None)
    assert str(plain) == "hf:stanfordnlp/imdb" and plain.text == "hf:stanfordnlp/imdb"
    for text, message in [
        ("", "empty"),
        ("  ", "empty"),
        ("hf:", "no dataset id"),
        ("hf:@test", "no dataset id"),
        ("hf:stanfordnlp/imdb@", "no split after '@'"),
    ]:
        assert message in _error(parse_source, text)


def test_parse_source_paths_relative_to_base(tmp_path, monkeypatch):
    base = tmp_path / "specs"
    (base / "data").mkdir(parents=True)
    assert parse_source("data/in.csv", base) == Source(
        "data/in.csv", base / "data/in.csv", *[None] * 3
    )
    absolute = tmp_path / "in.csv"
    assert parse_source(str(absolute), base).path == absolute
    assert parse_source("data/in.csv").path == Path("data/in.csv")  # the working directory's
    folder = parse_source("hf:data@validation", base)  # a local folder: no hub id
    assert (folder.path, folder.hub_id, folder.split) == (base / "data", None, "validation")
    monkeypatch.chdir(base)
    assert parse_source("hf:data").path == Path("data")
    assert parse_source("hf:elsewhere/data").hub_id == "elsewhere/data"  # no such folder
    assert "configurations are for hub datasets" in _error(parse_source, "hf:data:cola")


def test_csv_with_quoted_comma_and_newline(tmp_path):
    path = tmp_path / "in.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "text", "label"])
        writer.writerows([[1, "hello, world", "pos"], [2, "two\nlines", "neg"], [3, "NA", "pos"]])
    rows = _texts(path)
    assert rows.values == ["hello, world", "two\nlines", "NA"]  # "NA" is a text, not missing
    assert rows.labels == ["pos", "neg", "pos"] and rows.label_names is None
    assert _where(rows) == [f"{path}:2", f"{path}:3", f"{path}:5"]
    assert len(rows) == 3


def test_where_counts_the_lines_of_a_multi_line_field(tmp_path):
    path = _write(
        tmp_path / "in.csv",
        'text,label\n"one\ntwo\nthree",1\n\nfine,0\n"a, b",\n',  # row 3 lacks its label
    )
    message = _error(_texts, path)
    assert message == f"{path}:7: 'label' is missing"


def test_tsv_keeps_quote_characters_and_integer_labels(tmp_path):
    path = _write(tmp_path / "in.tsv", 'text\tlabel\nHe said "no\t1\n"quoted"\t0\n')
    rows = _texts(path)
    assert rows.values == ['He said "no', '"quoted"'] and rows.labels == [1, 0]
    assert _where(rows) == [f"{path}:2", f"{path}:3"]


def test_jsonl_and_gzip_with_raw_labels(tmp_path):
    lines = [
        json.dumps({"text": t, "label": label}) for t, label in zip(TEXTS, [1, 0, 1], strict=True)
    ]
    plain = _write(tmp_path / "in.jsonl", lines[0] + "\n\n" + "\n".join(lines[1:]) + "\n")
    gz = _write(tmp_path / "in.jsonl.gz", gzip.compress("\n".join(lines).encode()))
    for path, lines_of_rows in [(plain, [1, 3, 4]), (gz, [1, 2, 3])]:
        rows = _texts(path)
        assert rows.values == TEXTS and rows.labels == [1, 0, 1]
        assert _where(rows) == [f"{path}:{n}" for n in lines_of_rows]
    named = _write(tmp_path / "named.jsonl", '{"text": "a", "label": "pos"}\n{"text": "b"}\n')
    assert _error(_texts, named) == f"{named}:2: 'label' is missing"
    assert _error(_texts, named, labels=None) == f"{named}:2: 'label' is missing"  # column read
    assert _texts(named, labels=False).values == ["a", "b"]
    floats = _write(tmp_path / "floats.jsonl", '{"text": "a", "label": 1.0}\n')
    assert _texts(floats).labels == [1]


def test_parquet_and_class_label_names(tmp_path):
    features = Features({"sentence": Value("string"), "label": ClassLabel(names=["neg", "pos"])})
    table = Dataset.from_dict({"sentence": ["good", "bad"], "label": [1, 0]}, features=features)
    path = tmp_path / "in.parquet"
    table.to_parquet(path)
    rows = _texts(path, text_column="sentence")
    assert rows.values == ["good", "bad"] and rows.labels == [1, 0]
    assert rows.label_names == ["neg", "pos"]
    assert rows.where(1) == f"{path}: row 1"


def test_saved_folders_stand_in_for_hub_ids(tmp_path):
    features = Features({"text": Value("string"), "label": ClassLabel(names=["neg", "pos"])})
    train = Dataset.from_dict({"text": ["a", "b"], "label": [0, 1]}, features=features)
    validation = Dataset.from_dict({"text": ["c"], "label": [1]}, features=features)
    train.save_to_disk(tmp_path / "one")
    DatasetDict({"train": train, "validation": validation}).save_to_disk(tmp_path / "dict")
    one = read_texts(parse_source(f"hf:{tmp_path / 'one'}"))
    assert one.values == ["a", "b"] and one.labels == [0, 1] and one.label_names == ["neg", "pos"]
    assert one.where(1) == f"{tmp_path / 'one'}: row 1"
    default = read_texts(parse_source("hf:dict", tmp_path))  # the caller's split: train
    assert default.values == ["a", "b"]
    picked = read_texts(parse_source(f"hf:{tmp_path / 'dict'}@validation"), split="test")
    assert picked.values == ["c"] and picked.where(0) == f"{tmp_path / 'dict'}@validation: row 0"
    message = _error(read_texts, parse_source(f"hf:{tmp_path / 'dict'}"), split="test")
    assert message == f"{tmp_path / 'dict'}: no split 'test' (splits: 'train', 'validation')"
    assert "holds one Dataset" in _error(read_texts, parse_source(f"hf:{tmp_path / 'one'}@test"))
    Dataset.from_dict({"text": ["ok", " "]}).save_to_disk(tmp_path / "bad")
    message = _error(read_texts, parse_source(f"hf:{tmp_path / 'bad'}"), labels=None)
    assert message == f"{tmp_path / 'bad'}: row 1: 'text' is empty"


def test_label_modes(tmp_path):
    path = _write(tmp_path / "in.csv", "text,label,y\na,x,1\nb,y,2\n")
    assert _texts(path).labels == ["x", "y"]
    assert _texts(path, label_column="y").labels == [1, 2]
    assert _texts(path, labels=False).labels is None
    assert _texts(path, label_column=None).labels is None
    assert _texts(path, label_column="z", labels=None).labels is None
    message = _error(_texts, path, label_column="z")
    assert message == f"{path}: no label column 'z' (columns: 'text', 'label', 'y')"
    jsonl = _write(
        tmp_path / "in.jsonl", '{"text": "a", "label": true}\n{"text": "b", "label": false}\n'
    )
    assert _texts(jsonl).labels == ["True", "False"]  # as a CSV of the same labels reads
    csv = _write(tmp_path / "same.csv", "text,label\na,True\nb,False\n")
    assert _texts(csv).labels == _texts(jsonl).labels
    twice = _write(tmp_path / "twice.csv", "text,label,label\na,x,1\nb,y,2\n")
    message = f"{twice}: the header names 'label' in columns 2, 3; give each column its own name"
    assert _error(_texts, twice) == message
    assert _texts(twice, label_column=None).values == ["a", "b"]  # unread, it may repeat
    jsonl = _write(
        tmp_path / "bad.jsonl", '{"text": "a", "label": 1}\n{"text": "b", "label": [1]}\n'
    )
    assert f"{jsonl}:2: 'label' is a list" in _error(_texts, jsonl)


# ----------------------------------------------------------------------------- malformed files
GZIPPED = gzip.compress(b"".join(b'{"text": "row %d", "label": 1}\n' % i for i in range(300)))

MALFORMED = [
    (
        "in.jsonl",
        '{"text": "a", "label": 1}\n{"text": "b", "label": 0}\n{"text": "c"\n',
        ":3: not a JSON object",
    ),
    ("in.jsonl", '{"text": "a", "label": 1}\n["a", 1]\n', ":2: not a JSON object (a list)"),
    ("in.csv", "text,label\na,1\nb,0,extra\n", ":3: 3 fields where the header has 2"),
    ("in.tsv", "text\tlabel\na\t1\nb\t0\textra\n", ":3: 3 fields where the header has 2"),
    ("in.csv", 'text,label\n"never closed,1\nb,0\n', ":2: not a valid CSV row"),
    ("in.csv", "text,label\na,1\nb,0\n,1\n", ":4: 'text' is empty"),
    (
        "in.jsonl",
        '{"text": "a", "label": 1}\n\n{"text": "b", "label": 0}\n{"text": " ", "label": 0}\n',
        ":4: 'text' is empty",
    ),
    ("in.csv", "text,label\na,1\nb,\n", ":3: 'label' is missing"),
    ("in.tsv", "text\tlabel\na\t1\nb\n", ":3: 'label' is missing"),
    (
        "in.jsonl",
        '{"text": "a", "label": 1}\n{"text": "b", "label": null}\n',
        ":2: 'label' is missing",
    ),
    ("in.jsonl", '{"text": 3, "label": 1}\n', ":1: 'text' is a int, not a string"),
    (
        "in.jsonl",
        b'{"text": "a", "label": 1}\n{"text": "\xff", "label": 1}\n',
        ":2: not valid UTF-8",
    ),
    ("in.csv", b"text,label\na,1\n\xff\xfe,1\n", ":3: not valid UTF-8"),
    ("in.tsv", b"text\tlabel\na\t1\nb\xff\t1\n", ":3: not valid UTF-8"),
    ("in.jsonl.gz", GZIPPED[: len(GZIPPED) // 2], ": truncated (the gzip stream ends early)"),
    ("in.jsonl.gz", b"not gzip at all", ":1: not a gzip file"),
]


@pytest.mark.parametrize("name, content, message", MALFORMED)
def test_malformed_rows_are_named_by_file_and_line(tmp_path, name, content, message):
    path = _write(tmp_path / name, content)
    text = _error(_texts, path)
    assert text.startswith(f"{path}:") and message in text, text


def test_many_malformed_rows_in_one_line(tmp_path):
    path = _write(tmp_path / "in.csv", "text,label\n" + "".join(f"t{i},\n" for i in range(8)))
    message = _error(_texts, path)
    assert message.startswith(f"{path}:2: 'label' is missing; {path}:3: ")
    assert message.count("'label' is missing") == 5
    assert message.endswith(f"{path}:6: 'label' is missing (and 3 more malformed rows)")


FILE_ERRORS = [
    ("in.xlsx", "text\nfine\n", "unknown extension '.xlsx'; texts are read from .csv, .tsv"),
    ("in", "text\nfine\n", "unknown extension '(none)'"),
    ("in.csv", "", "empty file (no header naming the columns)"),
    ("in.csv", "text,label\n", "no rows"),
    ("in.jsonl", "\n\n", "no rows"),
    ("in.csv", "sentence,id\nfine,1\n", "no text column 'text' (columns: 'sentence', 'id')"),
    ("in.jsonl", '{"sentence": "a"}\n', "no text column 'text' (columns: 'sentence')"),
    (
        "in.csv",
        "text;label\nfine;1\n",
        "no text column 'text' (columns: 'text;label'); its header is one column holding ';': a "
        "file separated by ';'? save it with commas (.csv) or tabs (.tsv)",
    ),
    ("in.parquet", b"not parquet", "not a readable Parquet file"),
]


@pytest.mark.parametrize("name, content, message", FILE_ERRORS)
def test_file_errors(tmp_path, name, content, message):
    path = _write(tmp_path / name, content)
    text = _error(_texts, path)
    assert text.startswith(f"{path}: ") and message in text, text


def test_missing_file_and_formats(tmp_path):
    assert _error(_texts, tmp_path / "none.csv") == f"{tmp_path / 'none.csv'}: no such file"
    assert "read as hf:" in _error(_texts, tmp_path)
    assert ".parquet" in suffixes(formats("text")) and suffixes(formats("image")) == ".npz"
    assert HF_PREFIX == "hf:"
    npz = tmp_path / "x.npz"
    np.savez(npz, x=np.zeros((1, 2, 2)))
    assert "texts are read from" in _error(_texts, npz)
    table = _write(tmp_path / "in.csv", "text\na\n")
    assert "images are read from .npz" in _error(read_images, parse_source(str(table)))


def test_datasets_settings_are_restored(tmp_path, monkeypatch):
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temporary))  # where the datasets cache goes
    bars, verbosity = datasets.are_progress_bars_disabled(), datasets_logging.get_verbosity()
    _texts(_write(tmp_path / "in.csv", "text\nfine\n"), labels=None)
    _error(_texts, _write(tmp_path / "bad.jsonl", "{\n"))
    assert datasets.are_progress_bars_disabled() == bars
    assert datasets_logging.get_verbosity() == verbosity
    assert list(temporary.iterdir()) == []  # the temporary datasets caches are removed


# ----------------------------------------------------------------------------- images
def test_npz_images_keep_their_dtype(tmp_path):
    x = np.arange(5 * 8 * 8, dtype=np.uint8).reshape(5, 8, 8)
    np.savez(tmp_path / "three.npz", x=x, y=np.array([0, 1, 2, 1, 0]))
    np.savez(tmp_path / "four.npz", x=x[:, None].astype(np.float32), y=np.array(list("abcde")))
    three = read_images(parse_source(str(tmp_path / "three.npz")))
    assert three.values.dtype == np.uint8 and three.values.shape == (5, 1, 8, 8)
    np.testing.assert_array_equal(three.values[:, 0], x)
    assert three.labels == [0, 1, 2, 1, 0] and three.where(2) == f"{tmp_path / 'three.npz'}: row 2"
    four = read_images(parse_source(str(tmp_path / "four.npz")))
    assert four.values.dtype == np.float32 and four.labels == list("abcde")
    np.savez(tmp_path / "unlabelled.npz", x=x)
    assert read_images(parse_source(str(tmp_path / "unlabelled.npz")), labels=None).labels is None
    message = _error(read_images, parse_source(str(tmp_path / "unlabelled.npz")))
    assert message == f"{tmp_path / 'unlabelled.npz'}: no array 'y' with the labels (arrays: 'x')"


@pytest.mark.parametrize(
    "arrays, message",
    [
        ({"images": np.zeros((2, 4, 4))}, "no array 'x' with the images (arrays: 'images')"),
        (
            {"x": np.zeros((2, 16))},
            "array 'x' has shape (2, 16); images are (N, H, W) or (N, C, H, W)",
        ),
        ({"x": np.zeros((0, 4, 4))}, "array 'x' holds no images (shape (0, 4, 4))"),
        ({"x": np.array([[["a"]]])}, "array 'x' has dtype <U1, not numbers"),
        (
            {"x": np.array([[[0.0]], [[np.nan]]])},
            "array 'x' holds NaN or infinite values (image 1 first)",
        ),
        (
            {"x": np.zeros((2, 4, 4)), "y": np.zeros(3, int)},
            "array 'y' has shape (3,), not (2,) as the 2 images of 'x'",
        ),
        (
            {"x": np.zeros((2, 4, 4)), "y": np.array([True, False])},
            "array 'y' has dtype bool, not integers or strings",
        ),
        ({"x": np.zeros((2, 4, 4)), "y": np.array([1.0, np.nan])}, "row 1: 'y' is missing"),
    ],
)
def test_npz_errors(tmp_path, arrays, message):
    path = tmp_path / "in.npz"
    np.savez(path, **arrays)
    assert _error(read_images, parse_source(str(path))) == f"{path}: {message}"


def test_hf_image_dataset_saved_to_disk(tmp_path):
    rgb = [Image.fromarray(np.full((4, 5, 3), i, np.uint8)) for i in range(3)]
    features = Features({"image": datasets.Image(), "label": ClassLabel(names=["a", "b"])})
    Dataset.from_dict({"image": rgb, "label": [0, 1, 0]}, features=features).save_to_disk(
        tmp_path / "rgb"
    )
    rows = read_images(parse_source(f"hf:{tmp_path / 'rgb'}"))
    assert rows.values.shape == (3, 3, 4, 5) and rows.values.dtype == np.uint8
    assert rows.values[2].min() == rows.values[2].max() == 2
    assert rows.labels == [0, 1, 0] and rows.label_names == ["a", "b"]
    gray = [Image.fromarray(np.full((4, 5), i, np.uint8)) for i in range(2)]
    odd = Image.fromarray(np.zeros((3, 3), np.uint8))
    images = Features({"image": datasets.Image()})
    Dataset.from_dict({"image": gray}, features=images).save_to_disk(tmp_path / "gray")
    gray_rows = read_images(parse_source(f"hf:{tmp_path / 'gray'}"), labels=None)
    assert gray_rows.values.shape == (2, 1, 4, 5) and gray_rows.labels is None
    Dataset.from_dict({"image": [*gray, odd]}, features=images).save_to_disk(tmp_path / "odd")
    message = _error(read_images, parse_source(f"hf:{tmp_path / 'odd'}"), labels=None)
    shapes = "image of shape (C, H, W) = (1, 3, 3), the first is (1, 4, 5)"
    assert message == f"{tmp_path / 'odd'}: row 2: {shapes}"
    message = _error(read_images, parse_source(f"hf:{tmp_path / 'gray'}"))
    assert message == f"{tmp_path / 'gray'}: no label column 'label' (columns: 'image')"
    assert "no image column 'picture'" in _error(
        read_images, parse_source(f"hf:{tmp_path / 'gray'}"), image_column="picture"
    )


# ----------------------------------------------------------------------------- predict inputs
def test_read_inputs_from_stdin_and_txt(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join([*TEXTS, "  ", ""])))
    rows = read_inputs("-", "text")  # blank lines at the end are no inputs
    assert rows.values == TEXTS and rows.labels is None and rows.where(1) == "standard input:2"
    path = tmp_path / "in.txt"
    path.write_text("\n".join(TEXTS) + "\n", encoding="utf-8")
    rows = read_inputs(str(path), "text")
    assert rows.values == TEXTS and _where(rows) == [f"{path}:{n}" for n in (1, 2, 3)]
    path.write_text("\n".join([TEXTS[0], "", TEXTS[1], "   ", TEXTS[2]]) + "\n", encoding="utf-8")
    with pytest.raises(ProbtransError, match=r"in.txt:2: an empty line .*; .*in.txt:4: an empty"):
        read_inputs(str(path), "text")  # one row per line: a blank line inside is refused


def test_read_inputs_from_tables_with_labels_when_present(tmp_path):
    csv_path = tmp_path / "in.csv"
    with open(csv_path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(["id", "text"])
        writer.writerows([[i, text] for i, text in enumerate(TEXTS)])
    rows = read_inputs(str(csv_path), "text")
    assert rows.values == TEXTS and rows.labels is None
    tsv_path = _write(
        tmp_path / "in.tsv", "text\tlabel\n" + "".join(f"{t}\t{i}\n" for i, t in enumerate(TEXTS))
    )
    rows = read_inputs(str(tsv_path), "text")
    assert rows.values == TEXTS and rows.labels == [0, 1, 2]  # quotes kept: tabs only
    rows = "".join(json.dumps({"sentence": t}) + "\n" for t in TEXTS)
    jsonl = _write(tmp_path / "in.jsonl", rows + "\n")  # a trailing blank line is skipped
    assert read_inputs(str(jsonl), "text", text_column="sentence").values == TEXTS
    gz = _write(tmp_path / "in.jsonl.gz", gzip.compress(rows.encode()))
    assert read_inputs(str(gz), "text", text_column="sentence").values == TEXTS


def test_read_inputs_from_saved_folders_default_to_test(tmp_path, monkeypatch):
    DatasetDict(
        {"train": Dataset.from_dict({"text": ["a"]}), "test": Dataset.from_dict({"text": ["b"]})}
    ).save_to_disk(tmp_path / "saved")
    monkeypatch.chdir(tmp_path)
    assert read_inputs("hf:saved", "text").values == ["b"]
    assert read_inputs("hf:saved@train", "text").values == ["a"]


def test_read_input_images(tmp_path):
    x = np.random.default_rng(0).random((5, 8, 8))
    np.savez(tmp_path / "three.npz", x=x)
    np.savez(tmp_path / "four.npz", x=x[:, None], other=np.zeros(2))
    for name in ("three", "four"):
        rows = read_inputs(str(tmp_path / f"{name}.npz"), "image")
        assert rows.values.dtype == np.float64 and rows.values.shape == (5, 1, 8, 8)
        np.testing.assert_array_equal(rows.values[:, 0], x)
        assert rows.labels is None


INPUT_ERRORS = [
    ("missing.txt", None, "text", "missing.txt: no such file"),
    ("in.pdf", "text", "text", "in.pdf: unknown extension '.pdf'; texts are read from"),
    ("in", "text", "text", "in: unknown extension '(none)'"),
    ("in.txt", "x", "image", "in.txt: unknown extension '.txt'; images are read from .npz"),
    ("in.txt", "\n  \n", "text", "in.txt: no texts"),
    ("in.txt", b"fine\n\xff\xfe\n", "text", "in.txt:2: not valid UTF-8"),
    ("in.csv", "", "text", "in.csv: empty file (no header naming the columns)"),
    ("in.csv", "sentence,id\nfine,1\n", "text", "in.csv: no text column 'text' (columns:"),
    (
        "in.tsv",
        "id\tsentence\n1\tfine\n",
        "text",
        "in.tsv: no text column 'text' (columns: 'id', 'sentence')",
    ),
    ("in.csv", "text\n", "text", "in.csv: no rows"),
    ("in.csv", "id,text\n1,fine\n2,\n", "text", "in.csv:3: 'text' is empty"),
    ("in.csv", "id,text\n1,fine\n2\n", "text", "in.csv:3: 'text' is empty"),
    ("in.csv", b"text\n\xff\n", "text", "in.csv:2: not valid UTF-8"),
    ("in.jsonl", '{"text": "fine"}\n{"text": "ok"\n', "text", "in.jsonl:2: not a JSON object"),
    ("in.jsonl", '{"text": "fine"}\n["fine"]\n', "text", "in.jsonl:2: not a JSON object (a list)"),
    ("in.jsonl", '{"text": "a"}\n{"sentence": "b"}\n', "text", "in.jsonl:2: 'text' is missing"),
    ("in.jsonl", '{"text": 3}\n', "text", "in.jsonl:1: 'text' is a int, not a string"),
    ("in.jsonl", "\n\n", "text", "in.jsonl: no rows"),
    ("in.jsonl.gz", b"not gzip", "text", "in.jsonl.gz:1: not a gzip file"),
    ("in.npz", b"not a zip", "image", "in.npz: not an .npz archive (it starts with 'not a '"),
]


@pytest.mark.parametrize("name, content, kind, message", INPUT_ERRORS)
def test_input_errors(tmp_path, name, content, kind, message):
    source = tmp_path / name if content is None else _write(tmp_path / name, content)
    text = _error(read_inputs, str(source), kind)
    assert text.startswith(str(tmp_path)) and message in text, text


def test_stdin_errors(monkeypatch):
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n \n"))
    assert _error(read_inputs, "-", "text") == "standard input: no texts"
    assert _error(read_inputs, "-", "image").startswith(
        "standard input: images are read from .npz files or a Hugging Face dataset"
    )
    with pytest.raises(ValueError, match="kind must be 'text' or 'image'"):
        read_inputs("-", "tokens")


def test_npz_files_that_are_not_archives_of_arrays_are_refused_safely(tmp_path):
    text = tmp_path / "text.npz"
    text.write_text("hello")
    single = tmp_path / "single.npz"
    with open(single, "wb") as fh:
        np.save(fh, np.zeros(3))  # one .npy array under an .npz name
    objects = tmp_path / "objects.npz"
    np.savez(objects, x=np.array([{"a": 1}], dtype=object))
    for path, message in (  # a text file is named as one, not as "a pickle"
        (text, r"not an .npz archive \(it starts with 'hello', a text file\?\)"),
        (single, "one .npy array, not an .npz archive of named arrays"),
        (objects, "it holds pickled Python objects, refused"),
    ):
        with pytest.raises(ProbtransError, match=message) as caught:
            read_images(parse_source(str(path)))
        assert "allow_pickle" not in str(caught.value)


def test_an_unreachable_hub_fails_at_once_without_retries(monkeypatch):
    """No network: one failed request, then one error line (not ``datasets``' five retries,
    about 25 s); a data set the hub does not have is said so."""
    import time

    from huggingface_hub import HfApi
    from huggingface_hub.errors import RepositoryNotFoundError

    from probtrans.data.files import read_texts

    for var in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(var, raising=False)
    calls = []

    def no_network(self, repo_id, **kwargs):
        calls.append(repo_id)
        raise ConnectionError("[Errno -2] Name or service not known")

    monkeypatch.setattr(HfApi, "dataset_info", no_network)
    started = time.perf_counter()
    unreachable = r"hf:stanfordnlp/sst2@train: the Hugging Face hub cannot be reached .*OFFLINE=1"
    with pytest.raises(ProbtransError, match=unreachable):
        read_texts(parse_source("hf:stanfordnlp/sst2"))
    assert time.perf_counter() - started < 5 and calls == ["stanfordnlp/sst2"]

    class NotOnTheHub(RepositoryNotFoundError):
        def __init__(self) -> None:  # the hub's 404, without an HTTP response object
            Exception.__init__(self, "404")

    def missing(self, repo_id, **kwargs):
        raise NotOnTheHub()

    monkeypatch.setattr(HfApi, "dataset_info", missing)
    with pytest.raises(ProbtransError, match="no such data set on the Hugging Face hub"):
        read_texts(parse_source("hf:nobody/nothing"))


def test_a_text_column_reads_as_the_list_of_its_texts(tmp_path, monkeypatch):
    """A table's texts stay Arrow strings (:class:`TextColumn`) and read as the list they are:
    items, slices of any step and sign, iteration across Arrow chunks and slice sizes."""
    import pyarrow as pa

    texts = [f"text {i}" for i in range(10)] + ["ünï", None]
    column = TextColumn(pa.chunked_array([texts[:4], texts[4:9], texts[9:]]))
    monkeypatch.setattr(TextColumn, "SLICE_ROWS", 5)
    assert len(column) == 12 and list(column) == texts and column == texts
    for index in (0, 3, 4, 10, -1, -12):
        assert column[index] == texts[index]
    for part in (slice(2, 7), slice(None, None, -3), slice(-5, None), slice(8, 3), slice(1, 50, 4)):
        assert column[part] == texts[part]
    with pytest.raises(IndexError):
        column[12]
    assert column != texts[:-1] and column != "text 0"
    path = _write(
        tmp_path / "rows.csv", "text,label\n" + "".join(f"t{i},{i % 2}\n" for i in range(30))
    )
    rows = read_inputs(str(path), "text")
    assert isinstance(rows.values, TextColumn) and rows.values == [f"t{i}" for i in range(30)]


# ----------------------------------------------------------------------------- streamed inputs
TXT_CASES = [
    ("in.txt", "\ufeffa\nb\r\nc\n\n\n", None),
    ("in.txt", "a\n\nb\n", ":2: an empty line"),
    ("in.txt", b"a\n\xff\n", ":2: not valid UTF-8"),
]


@pytest.mark.parametrize("name, content, message", MALFORMED + TXT_CASES + FILE_ERRORS)
def test_an_input_read_a_chunk_at_a_time_is_the_input_read_whole(tmp_path, name, content, message):
    """``probtrans predict``'s texts read 2 rows at a time (:func:`input_text_chunks`) are the
    texts :func:`read_inputs` reads whole, and a file it refuses is refused with its message,
    whichever chunk holds the problem (labels are not read: ``predict`` without ``--labels``)."""
    path = _write(tmp_path / name, content)
    try:
        whole = list(read_inputs(str(path), "text", label_column=None).values)
    except ProbtransError as err:
        assert _error(lambda: list(input_text_chunks(str(path), 2))) == str(err)
        return
    chunks = list(input_text_chunks(str(path), 2))
    assert [text for chunk in chunks for text in chunk] == whole
    assert all(len(chunk) == 2 for chunk in chunks[:-1]) and 1 <= len(chunks[-1]) <= 2


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".jsonl", ".jsonl.gz", ".parquet", ".txt"])
def test_every_text_format_is_read_a_chunk_at_a_time(tmp_path, suffix):
    """Each built-in text format streams its text column: 25 texts (quotes, commas, "NA",
    non-ASCII) in chunks of 4, as read whole; a bad text in the last chunk names its line."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    texts = [f'text {i}, "quoted" ünï' for i in range(24)] + ["NA"]
    path = tmp_path / f"in{suffix}"
    if suffix == ".csv":
        with open(path, "w", newline="", encoding="utf-8") as fh:
            csv.writer(fh).writerows([["id", "text"], *([i, t] for i, t in enumerate(texts))])
    elif suffix == ".tsv":
        path.write_text("text\tid\n" + "".join(f"{t}\t{i}\n" for i, t in enumerate(texts)))
    elif suffix in (".jsonl", ".jsonl.gz"):
        lines = "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(texts))
        opener = gzip.open if suffix.endswith(".gz") else open
        with opener(path, "wt", encoding="utf-8") as fh:
            fh.write(lines)
    elif suffix == ".parquet":
        pq.write_table(pa.table({"text": texts, "id": list(range(25))}), path)
    else:
        path.write_text("\n".join(texts) + "\n")
    chunks = list(input_text_chunks(str(path), 4))
    assert [len(chunk) for chunk in chunks] == [4] * 6 + [1]
    assert [text for chunk in chunks for text in chunk] == texts
    assert input_text_chunks("-", 4) is None  # standard input: read whole


# ----------------------------------------------------------------------------- data folders
def test_a_folder_of_images_in_one_subfolder_per_class_reads_as_datasets_imagefolder(
    tmp_path, monkeypatch
):
    """``hf:FOLDER`` of PNG files in class subfolders (not written by save_to_disk): the images
    as the files hold them, labelled by their subfolder's name; its one split is read whatever
    split is asked for where the source names none."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    rng = np.random.default_rng(0)
    pixels = {}
    for name in ("cat", "dog"):
        (tmp_path / "pets" / name).mkdir(parents=True)
        for i in range(3):
            pixels[name, i] = rng.integers(0, 256, (6, 5, 3), dtype=np.uint8)
            Image.fromarray(pixels[name, i]).save(tmp_path / "pets" / name / f"{i}.png")
    for split in ("train", "test"):
        rows = read_images(parse_source("hf:pets", tmp_path), split=split)
        assert rows.label_names == ["cat", "dog"] and sorted(rows.labels) == [0, 0, 0, 1, 1, 1]
        images = np.asarray(rows.values)
        assert images.shape == (6, 3, 6, 5)  # (N, C, H, W)
        for image, label in zip(images, rows.labels, strict=True):
            name = rows.label_names[label]
            match = [
                i for i in range(3) if np.array_equal(image, pixels[name, i].transpose(2, 0, 1))
            ]
            assert len(match) == 1


def test_a_folder_of_csv_files_reads_each_split_from_its_files_name(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "reviews").mkdir()
    (tmp_path / "reviews" / "train.csv").write_text("text,label\ngood,pos\nbad,neg\nfine,pos\n")
    (tmp_path / "reviews" / "test.csv").write_text("text,label\nawful,neg\n")
    train = read_texts(parse_source("hf:reviews", tmp_path))
    assert train.values == ["good", "bad", "fine"] and train.labels == ["pos", "neg", "pos"]
    test = read_texts(parse_source("hf:reviews@test", tmp_path))
    assert test.values == ["awful"] and test.labels == ["neg"]
    (tmp_path / "nothing").mkdir()
    with pytest.raises(ProbtransError, match=r"nothing: neither a folder written by save_to_disk"):
        read_texts(parse_source("hf:nothing", tmp_path))
