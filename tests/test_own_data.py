"""A model spec's ``[data]`` table reading the user's own files (:mod:`probtrans.data.file_bundle`):
spec validation, every source format giving one bundle, class orders, seeded fraction splits,
named out-of-domain sets, malformed rows named by file and line, ``.npz`` images and their
standardisation, corrupted digits, saving a bundle in a run folder, and the CIFAR-10 specs on
small generated files. Every file is small and written in ``tmp_path``; nothing reaches the hub.
"""

from __future__ import annotations

import csv
import gzip
import json
import random
import re
from pathlib import Path

import datasets
import numpy as np
import pandas as pd
import pyro
import pytest
import torch

from probtrans.classifier import build_classifier
from probtrans.data import NO_LABEL, DataBundle, DataSplit, load_data
from probtrans.data.corruptions import corrupt
from probtrans.data.saved import load_saved_bundle, save_bundle
from probtrans.errors import ConfigError, ProbtransError
from probtrans.resolve import load_model_spec, spec_folder
from probtrans.specs import DataSpec, ModelSpec
from probtrans.specs.base import parse, updated
from probtrans.storage.checkpoint import load_checkpoint

ROOT = Path(__file__).resolve().parents[1]
POSITIVE = ("good", "great", "fine", "lovely", "superb")
NEGATIVE = ("bad", "awful", "poor", "dreadful", "weak")
FILLER = ("the", "film", "was", "plot", "acting", "really", "quite")
UNK = "[UNK]"

Row = tuple[str, ...]


# ----------------------------------------------------------------------------- helpers
def corpus(n: int, seed: int, pattern: tuple[str, ...] = ("pos", "neg")) -> list[Row]:
    """n distinct (text, label) rows, labels ``pattern`` in turn: two sentiment words of the
    label and three filler words, shuffled (lower case, no punctuation: decode gives the text
    back when every word is in the vocabulary)."""
    rng = random.Random(seed)
    rows: list[Row] = []
    seen: set[str] = set()
    while len(rows) < n:
        label = pattern[len(rows) % len(pattern)]
        words = rng.sample(POSITIVE if label == "pos" else NEGATIVE, 2) + rng.sample(FILLER, 3)
        rng.shuffle(words)
        text = " ".join(words)
        if text not in seen:
            seen.add(text)
            rows.append((text, label))
    return rows


def write_rows(path: Path, rows: list[Row], columns: Row = ("text", "label")) -> Path:
    """``rows`` as the table format of ``path``'s extension, with a header of ``columns``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    records = [dict(zip(columns, row, strict=True)) for row in rows]
    name = path.name
    if name.endswith(".tsv"):
        lines = ["\t".join(columns)] + ["\t".join(map(str, row)) for row in rows]
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    elif name.endswith(".csv"):
        with open(path, "w", newline="", encoding="utf-8") as fh:
            writer = csv.writer(fh)
            writer.writerow(columns)
            writer.writerows(rows)
    elif name.endswith(".jsonl"):
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    elif name.endswith(".jsonl.gz"):
        path.write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode()))
    elif name.endswith(".parquet"):
        pd.DataFrame(records, columns=list(columns)).to_parquet(path)
    else:
        raise ValueError(name)
    return path


def data_spec(**data) -> DataSpec:
    """The ``[data]`` table ``data`` (``kind`` text unless given), validated."""
    return parse(ModelSpec, {"data": {"kind": "text", **data}}, "test.toml").data


def texts_of(bundle: DataBundle, split: DataSplit) -> list[str]:
    """The words of each row of ``split`` as the model sees them."""
    return [bundle.decode(row.tolist()) for row in split.inputs]


def error(call, *args) -> str:
    """The one-line message of the ProbtransError ``call(*args)`` raises."""
    with pytest.raises(ProbtransError) as err:
        call(*args)
    message = str(err.value)
    assert "\n" not in message, message
    return message


def cifar_like(n: int, seed: int, classes: int = 4, shape: Row = (3, 32, 32)):
    """n random uint8 images of ``shape`` and labels 0..classes−1 in turn."""
    x = np.random.default_rng(seed).integers(0, 256, size=(n, *shape), dtype=np.uint8)
    return x, np.arange(n) % classes


def standardised(x: np.ndarray, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """Raw 8-bit images (N, C, H, W) as x / 255 standardised per channel (float64)."""
    return (x / 255.0 - mean[:, None, None]) / std[:, None, None]


# ----------------------------------------------------------------------------- 1. validation
SPEC_ERRORS = [
    ('train = "a.tsv"', "data.kind = None: is required with data.train: 'text' or 'image'"),
    ('kind = "text"', "data.train = None: is required with data.kind"),
    ('labels = ["a", "b"]', "data.train = None: is required with data.labels"),
    (
        'name = "imdb"\nkind = "text"\ntrain = "a.tsv"',
        "data.name = 'imdb': give a registered data set or train, not both",
    ),
    (
        'kind = "text"\ntrain = "a.tsv"\n[[data.ood]]\nname = "q"\nsource = "x.tsv"\n'
        '[[data.ood]]\nname = "q"\nsource = "y.tsv"',
        "data.ood = ['q']: names each set once",
    ),
    (
        'kind = "text"\ntrain = "a.tsv"\n[[data.ood]]\nname = "my set"\nsource = "x.tsv"',
        "data.ood[0].name = 'my set': string should match pattern",
    ),
]


@pytest.mark.parametrize("table, message", SPEC_ERRORS)
def test_spec_errors_name_the_file_and_field(tmp_path, table, message):
    path = tmp_path / "model.toml"
    path.write_text(f"[data]\n{table}\n")
    with pytest.raises(ConfigError) as err:
        load_model_spec(path)
    assert str(err.value).startswith(f"{path}: {message}"), str(err.value)


def test_train_sets_the_name_files_and_files_alone_needs_train(tmp_path):
    assert data_spec(train="a.tsv").name == "files"
    assert data_spec(name="files", train="a.tsv").name == "files"
    with pytest.raises(
        ConfigError, match=re.escape("data.train = None: is required with data.name = files")
    ):
        parse(ModelSpec, {"data": {"name": "files"}}, "m.toml")


# ----------------------------------------------------------------------------- 2. the example
EXAMPLE_SPEC = """
[data]
kind = "text"
train = "data/train.tsv"
validation = "data/dev.tsv"
test = "data/test.tsv"
text_column = "text"
label_column = "label"
labels = ["neg", "pos"]
max_len = 64
[[data.ood]]
name = "questions"
source = "other/questions.tsv"
"""
QUESTIONS = ["what is good", "who made the film", "why bad"]


def example_project(folder: Path) -> tuple[Path, dict[str, list[Row]]]:
    """The files of the example spec under ``folder`` (a word only in dev, one only in test)."""
    rows = {
        "train": corpus(60, 0),
        "dev": corpus(10, 1) + [("walrus good plot", "pos")],
        "test": corpus(12, 2) + [("zebra bad film", "neg")],
    }
    for name, split_rows in rows.items():
        write_rows(folder / "data" / f"{name}.tsv", split_rows)
    write_rows(folder / "other" / "questions.tsv", [(q,) for q in QUESTIONS], ("text",))
    spec = folder / "model.toml"
    spec.write_text(EXAMPLE_SPEC)
    return spec, rows


def test_the_example_spec_reads_its_files_relative_to_its_folder(tmp_path, monkeypatch):
    project = tmp_path / "project"
    spec_path, rows = example_project(project)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    spec = load_model_spec(spec_path)
    assert spec.data.name == "files"
    assert spec_folder(spec) == project
    bundle = load_data(spec.data, spec_folder(spec))
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (60, 11, 13)
    assert bundle.class_names == ["neg", "pos"]
    assert bundle.description["sources"]["train"] == str(project / "data" / "train.tsv")
    for split, name in ((bundle.train, "train"), (bundle.val, "dev"), (bundle.test, "test")):
        expected = [["neg", "pos"].index(label) for _, label in rows[name]]
        assert split.labels.tolist() == expected
    # the vocabulary is the training split's: dev's and test's own words are unknown (id 1)
    vocab = bundle.tokenizer.get_vocab()
    assert "walrus" not in vocab and "zebra" not in vocab
    assert bundle.decode(bundle.val.inputs[-1].tolist()) == f"{UNK} good plot"
    assert bundle.decode(bundle.test.inputs[-1].tolist()) == f"{UNK} bad film"
    assert bundle.test.inputs[-1, 0] == 1
    assert texts_of(bundle, bundle.train) == [text for text, _ in rows["train"]]
    # the out-of-domain set without a label column: every label −1, read with the same tokenizer
    questions = bundle.ood["questions"]
    assert list(bundle.ood) == ["questions"]
    assert questions.labels.tolist() == [NO_LABEL] * 3
    assert texts_of(bundle, questions) == [
        f"{UNK} {UNK} good",
        f"{UNK} {UNK} the film",
        f"{UNK} bad",
    ]
    # without the spec's folder, the relative paths start at the working folder (and fail)
    message = error(load_data, spec.data)
    assert message == f"{Path('data/train.tsv')}: no such file"


# ----------------------------------------------------------------------------- 3. formats
FORMATS = ["csv", "tsv", "jsonl", "jsonl.gz", "parquet", "hf", "hf-default-split"]
SPLIT_ROWS = {"train": corpus(60, 0), "validation": corpus(10, 1), "test": corpus(12, 2)}


def saved_folder(path: Path, features: datasets.Features | None = None, label=None) -> Path:
    """SPLIT_ROWS as a DatasetDict written by save_to_disk (labels mapped by ``label``)."""
    label = label or (lambda value: value)
    splits = {
        name: datasets.Dataset.from_dict(
            {"text": [t for t, _ in rows], "label": [label(v) for _, v in rows]},
            features=features,
        )
        for name, rows in SPLIT_ROWS.items()
    }
    datasets.DatasetDict(splits).save_to_disk(str(path))
    return path


def sources(tmp_path: Path, kind: str) -> dict[str, str]:
    """train, validation and test of SPLIT_ROWS written as ``kind``."""
    if kind.startswith("hf"):
        folder = saved_folder(tmp_path / "saved")
        train = f"hf:{folder}" if kind == "hf-default-split" else f"hf:{folder}@train"
        return {
            "train": train,
            "validation": f"hf:{folder}@validation",
            "test": f"hf:{folder}@test",
        }
    return {
        name: str(write_rows(tmp_path / f"{name}.{kind}", rows))
        for name, rows in SPLIT_ROWS.items()
    }


@pytest.mark.parametrize("kind", FORMATS)
def test_every_source_format_gives_the_same_bundle(tmp_path, kind):
    reference = load_data(data_spec(**sources(tmp_path / "reference", "tsv")))
    bundle = load_data(data_spec(**sources(tmp_path / "given", kind)))
    assert bundle.class_names == reference.class_names == ["neg", "pos"]
    for split in ("train", "val", "test"):
        mine, theirs = getattr(bundle, split), getattr(reference, split)
        assert torch.equal(mine.inputs, theirs.inputs), split
        assert torch.equal(mine.mask, theirs.mask), split
        assert torch.equal(mine.labels, theirs.labels), split
    expected = [["neg", "pos"].index(label) for _, label in SPLIT_ROWS["test"]]
    assert bundle.test.labels.tolist() == expected
    assert texts_of(bundle, bundle.test) == [text for text, _ in SPLIT_ROWS["test"]]


# ----------------------------------------------------------------------------- 4. classes
def test_class_label_names_become_the_class_names(tmp_path):
    features = datasets.Features(
        {
            "text": datasets.Value("string"),
            "label": datasets.ClassLabel(names=["negative", "positive"]),
        }
    )
    folder = saved_folder(tmp_path / "saved", features, label=lambda value: int(value == "pos"))
    spec = data_spec(
        train=f"hf:{folder}", validation=f"hf:{folder}@validation", test=f"hf:{folder}@test"
    )
    bundle = load_data(spec)
    assert bundle.class_names == ["negative", "positive"]
    assert bundle.test.labels.tolist() == [int(v == "pos") for _, v in SPLIT_ROWS["test"]]


def test_class_labels_of_two_sources_that_number_them_otherwise_are_read_by_name(tmp_path):
    """A test set whose ClassLabel lists the classes in another order (or another set of them),
    as a folder of one class, or a hub split relabelled, does: its integers are read by their
    names, for the test split, an out-of-domain set and predict's --labels alike."""
    from probtrans.data.file_bundle import label_indices
    from probtrans.data.files import parse_source, read_texts

    def features(names: list[str]) -> datasets.Features:
        return datasets.Features(
            {"text": datasets.Value("string"), "label": datasets.ClassLabel(names=names)}
        )

    train = saved_folder(tmp_path / "train", features(["neg", "pos"]), ["neg", "pos"].index)
    flipped = saved_folder(tmp_path / "flipped", features(["pos", "neg"]), ["pos", "neg"].index)
    spec = data_spec(train=f"hf:{train}", test=f"hf:{flipped}@test")
    bundle = load_data(spec)
    expected = [["neg", "pos"].index(label) for _, label in SPLIT_ROWS["test"]]
    assert bundle.class_names == ["neg", "pos"] and bundle.test.labels.tolist() == expected
    rows = read_texts(parse_source(f"hf:{flipped}@test"))
    assert label_indices(rows, bundle, spec, "input").tolist() == expected
    ordered = load_data(
        data_spec(train=f"hf:{train}", test=f"hf:{train}@test", labels=["pos", "neg"])
    )
    assert ordered.test.labels.tolist() == [1 - c for c in expected]  # data.labels names them
    other = saved_folder(tmp_path / "other", features(["pos", "meh"]), lambda v: int(v == "neg"))
    with pytest.raises(
        ProbtransError,
        match=r"other@test: row 1: label = 'meh': not one of the classes \['neg', 'pos'\]",
    ):
        load_data(data_spec(train=f"hf:{train}", test=f"hf:{other}@test"))
    novel = [{"name": "novel", "source": f"hf:{other}"}]  # other classes: say how to ignore them
    with pytest.raises(ProbtransError, match=r"set 'novel'; label_column = \"\" in its table"):
        load_data(data_spec(train=f"hf:{train}", ood=novel))
    novel[0]["label_column"] = ""
    assert (load_data(data_spec(train=f"hf:{train}", ood=novel)).ood["novel"].labels == -1).all()
    csv_test = write_rows(tmp_path / "test.tsv", [(t, int(v == "pos")) for t, v in corpus(12, 2)])
    integers = load_data(data_spec(train=f"hf:{train}", test=str(csv_test)))  # class indices
    assert integers.test.labels.tolist() == [int(v == "pos") for _, v in corpus(12, 2)]


def integer_files(tmp_path: Path) -> dict[str, str]:
    """train and test TSV files with integer labels (1 = pos, 0 = neg)."""
    return {
        name: str(write_rows(tmp_path / f"{name}.tsv", [(t, int(v == "pos")) for t, v in rows]))
        for name, rows in (("train", corpus(40, 0)), ("test", corpus(12, 2)))
    }


def test_integer_labels_without_names_are_their_own_names(tmp_path):
    files = integer_files(tmp_path)
    bundle = load_data(data_spec(**files))
    assert bundle.class_names == ["0", "1"]
    assert bundle.test.labels.tolist() == [int(v == "pos") for _, v in corpus(12, 2)]


def test_integer_labels_listed_in_labels_are_reordered(tmp_path):
    files = integer_files(tmp_path)
    bundle = load_data(data_spec(**files, labels=[1, 0]))
    assert bundle.class_names == ["1", "0"]
    assert bundle.test.labels.tolist() == [int(v == "neg") for _, v in corpus(12, 2)]
    named = load_data(data_spec(**files, labels=["negative", "positive"]))  # names of 0, 1
    assert named.class_names == ["negative", "positive"]
    assert named.test.labels.tolist() == [int(v == "pos") for _, v in corpus(12, 2)]


def test_string_labels_are_sorted_unless_labels_orders_them(tmp_path):
    rows = corpus(40, 0, pattern=("pos", "neg", "mixed"))  # first seen: pos, neg, mixed
    test_rows = corpus(12, 2, pattern=("pos", "neg", "mixed"))
    files = {"train": write_rows(tmp_path / "train.tsv", rows)}
    files["test"] = write_rows(tmp_path / "test.tsv", test_rows)
    files = {name: str(path) for name, path in files.items()}
    bundle = load_data(data_spec(**files))
    assert bundle.class_names == ["mixed", "neg", "pos"]
    assert bundle.test.labels.tolist() == [["mixed", "neg", "pos"].index(v) for _, v in test_rows]
    order = ["pos", "neg", "mixed"]
    ordered = load_data(data_spec(**files, labels=order))
    assert ordered.class_names == order
    assert ordered.test.labels.tolist() == [order.index(v) for _, v in test_rows]


def test_a_label_outside_the_listed_classes_is_named_by_file_and_line(tmp_path):
    train = write_rows(tmp_path / "train.tsv", corpus(20, 0) + [("so so plot", "meh")])
    message = error(load_data, data_spec(train=str(train), labels=["neg", "pos"]))
    assert message == f"{train}:22: label = 'meh': not one of the classes ['neg', 'pos']"


def test_a_missing_value_label_is_refused_unless_labels_declares_it(tmp_path):
    rows = [(text, "NaN" if i % 4 == 3 else y) for i, (text, y) in enumerate(corpus(40, 0))]
    train = write_rows(tmp_path / "train.csv", rows)
    message = error(load_data, data_spec(train=str(train)))
    assert message.startswith(
        f"{train}:5: 'label' is 'NaN', a missing value (list it in data.labels to make it a "
        f"class); {train}:9: "
    )
    bundle = load_data(data_spec(train=str(train), labels=["neg", "pos", "NaN"]))
    assert bundle.class_names == ["neg", "pos", "NaN"]
    assert (bundle.train.labels == 2).sum() > 0
    table = tmp_path / "train.parquet"  # a float NaN (a null) is missing, whatever labels says
    labels = [float("nan") if y == "NaN" else y for _, y in rows]
    pd.DataFrame({"text": [text for text, _ in rows], "label": labels}).to_parquet(table)
    message = error(load_data, data_spec(train=str(table), labels=["neg", "pos", "NaN"]))
    assert message.startswith(f"{table}: row 3: 'label' is missing; {table}: row 7: ")


# ----------------------------------------------------------------------------- 5. fractions
UNBALANCED = ("pos", "pos", "neg")  # 2/3 positive


def fraction_bundle(tmp_path: Path, **data) -> tuple[DataBundle, list[Row]]:
    rows = corpus(60, 0, UNBALANCED)
    path = tmp_path / "train.tsv"
    if not path.exists():
        write_rows(path, rows)
    return load_data(data_spec(train=str(path), **data)), rows


def split_texts(bundle: DataBundle) -> dict[str, list[str]]:
    texts = {s: texts_of(bundle, getattr(bundle, s)) for s in ("train", "val", "test")}
    assert not any(UNK in text for split in texts.values() for text in split)
    return texts


def test_fraction_splits_are_sized_stratified_and_seeded(tmp_path):
    bundle, rows = fraction_bundle(tmp_path, val_fraction=0.2, test_fraction=0.25)
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (33, 12, 15)
    assert bundle.description["split_off_train"] == ["test", "val"]
    texts = split_texts(bundle)
    label_of = dict(rows)
    assert sorted(sum(texts.values(), [])) == sorted(label_of)  # a partition of the file
    for split, size in (("train", 33), ("val", 12), ("test", 15)):
        split_rows = getattr(bundle, split)
        # stratified: 2/3 of every split is positive, as in the file
        assert int((split_rows.labels == 1).sum()) == 2 * size // 3, split
        assert split_rows.labels.tolist() == [
            ["neg", "pos"].index(label_of[t]) for t in texts[split]
        ]
    again, _ = fraction_bundle(tmp_path, val_fraction=0.2, test_fraction=0.25)
    assert split_texts(again) == texts
    assert torch.equal(again.test.inputs, bundle.test.inputs)
    other, _ = fraction_bundle(tmp_path, val_fraction=0.2, test_fraction=0.25, split_seed=1)
    other_texts = split_texts(other)
    assert set(other_texts["test"]) != set(texts["test"])
    assert set(other_texts["val"]) != set(texts["val"])
    assert int((other.test.labels == 1).sum()) == 10


def test_only_the_missing_split_is_taken_off_train(tmp_path):
    test = write_rows(tmp_path / "test.tsv", corpus(9, 5))
    bundle, _ = fraction_bundle(tmp_path, test=str(test), val_fraction=0.25)
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (45, 15, 9)
    assert bundle.description["split_off_train"] == ["val"]


def test_fraction_sizes_are_the_fractions_of_train(tmp_path):
    bundle, _ = fraction_bundle(tmp_path, val_fraction=0.1, test_fraction=0.3)
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (36, 6, 18)


# ----------------------------------------------------------------------------- 6. OOD sets
def test_named_ood_sets_with_and_without_labels(tmp_path):
    train = write_rows(tmp_path / "train.tsv", corpus(60, 0))
    labelled = [("good fine film", "pos"), ("bad poor plot", "neg"), ("great acting", "pos")]
    write_rows(tmp_path / "ood" / "labelled.tsv", labelled)
    write_rows(tmp_path / "ood" / "plain.jsonl", [("the film",), ("okapi",)], ("text",))
    other = [("good film", "pos"), ("so so plot", "meh"), ("bad", "neg")]
    other_path = write_rows(tmp_path / "ood" / "other.csv", other)
    sets = [
        {"name": "labelled", "source": "ood/labelled.tsv"},
        {"name": "plain", "source": "ood/plain.jsonl"},
    ]
    bundle = load_data(data_spec(train="train.tsv", ood=sets), tmp_path)
    assert list(bundle.ood) == ["labelled", "plain"]
    assert bundle.ood["labelled"].labels.tolist() == [
        bundle.class_names.index(v) for _, v in labelled
    ]
    assert texts_of(bundle, bundle.ood["labelled"]) == [t for t, _ in labelled]
    assert bundle.ood["plain"].labels.tolist() == [NO_LABEL, NO_LABEL]
    assert texts_of(bundle, bundle.ood["plain"]) == ["the film", UNK]
    # labels that are not classes of the task are refused, naming the file and line
    refused = data_spec(train=str(train), ood=[{"name": "other", "source": str(other_path)}])
    message = error(load_data, refused)
    assert message.startswith(
        f"{other_path}:3: label 'meh' is not one of the classes ['neg', 'pos']"
    )
    assert "out-of-domain set 'other'" in message
    # ... unless its label column is ignored
    ignored = {"name": "other", "source": str(other_path), "label_column": ""}
    bundle = load_data(data_spec(train=str(train), ood=[ignored]))
    assert bundle.ood["other"].labels.tolist() == [NO_LABEL] * 3
    assert texts_of(bundle, bundle.ood["other"]) == ["good film", f"{UNK} {UNK} plot", "bad"]


def test_an_ood_set_may_read_its_own_columns(tmp_path):
    train = write_rows(tmp_path / "train.tsv", corpus(30, 0))
    ood = write_rows(
        tmp_path / "q.tsv", [("great plot", "pos"), ("awful", "neg")], ("question", "y")
    )
    spec = data_spec(
        train=str(train),
        ood=[{"name": "q", "source": str(ood), "text_column": "question", "label_column": "y"}],
    )
    bundle = load_data(spec)
    assert bundle.ood["q"].labels.tolist() == [1, 0]
    assert texts_of(bundle, bundle.ood["q"]) == ["great plot", "awful"]
    # integer labels are no classes of a task whose classes are its string labels
    write_rows(tmp_path / "q.tsv", [("great plot", "1"), ("awful", "0")], ("question", "y"))
    assert "q.tsv:2: label 1 is not one of the classes" in error(load_data, spec)


# ----------------------------------------------------------------------------- 7. malformed
def test_an_empty_text_is_named_by_file_and_line(tmp_path):
    path = tmp_path / "train.tsv"
    path.write_text("text\tlabel\ngood fine\tpos\nbad poor\tneg\n\tpos\nfine film\tpos\n")
    assert error(load_data, data_spec(train=str(path))) == f"{path}:4: 'text' is empty"


def test_a_broken_json_line_is_named_by_file_and_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text(
        '{"text": "good", "label": "pos"}\n{"text": "bad", "label": "neg"}\n'
        '{"text": "oops", "label": \n{"text": "fine", "label": "pos"}\n'
    )
    message = error(load_data, data_spec(train=str(path)))
    assert message == f"{path}:3: not a JSON object (Expecting value)"


def test_a_missing_label_column_is_named_with_the_file(tmp_path):
    path = write_rows(tmp_path / "train.csv", corpus(10, 0), ("text", "sentiment"))
    message = error(load_data, data_spec(train=str(path)))
    assert message == f"{path}: no label column 'label' (columns: 'text', 'sentiment')"
    bundle = load_data(data_spec(train=str(path), label_column="sentiment", test_fraction=0.3))
    assert bundle.class_names == ["neg", "pos"]


def test_an_unknown_format_is_refused_naming_its_extension(tmp_path):
    path = tmp_path / "train.xlsx"
    path.write_bytes(b"PK\x03\x04")
    message = error(load_data, data_spec(train=str(path)))
    assert message.startswith(f"{path}: unknown extension '.xlsx'; texts are read from .csv, .tsv")


# ----------------------------------------------------------------------------- 8. images
def image_files(tmp_path: Path, shape: Row = (3, 32, 32)) -> dict[str, np.ndarray]:
    """train (40), validation (8), test (12) and an unlabelled OOD set (5) as .npz files."""
    arrays = {}
    for seed, (name, n) in enumerate((("train", 40), ("validation", 8), ("test", 12))):
        x, y = cifar_like(n, seed, shape=shape)
        np.savez(tmp_path / f"{name}.npz", x=x, y=y)
        arrays[name], arrays[f"{name}_y"] = x, y
    arrays["ood"] = cifar_like(5, 9, shape=shape)[0]
    np.savez(tmp_path / "ood.npz", x=arrays["ood"])
    return arrays


def image_spec(tmp_path: Path, **data) -> DataSpec:
    files = {name: str(tmp_path / f"{name}.npz") for name in ("train", "validation", "test")}
    ood = [{"name": "noise", "source": str(tmp_path / "ood.npz")}]
    return data_spec(kind="image", **files, ood=ood, **data)


def test_npz_images_are_standardised_with_the_training_split(tmp_path):
    arrays = image_files(tmp_path)
    bundle = load_data(image_spec(tmp_path))
    assert bundle.kind == "image" and bundle.image_shape == (3, 32, 32)
    assert bundle.class_names == ["0", "1", "2", "3"]
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (40, 8, 12)
    assert bundle.test.labels.tolist() == arrays["test_y"].tolist()
    train = bundle.train.inputs
    torch.testing.assert_close(train.mean(dim=(0, 2, 3)), torch.zeros(3), rtol=0, atol=1e-4)
    torch.testing.assert_close(train.std(dim=(0, 2, 3)), torch.ones(3), rtol=0, atol=1e-4)
    pixels = arrays["train"] / 255.0
    mean, std = pixels.mean(axis=(0, 2, 3)), pixels.std(axis=(0, 2, 3), ddof=1)
    assert bundle.scaling.eight_bit
    np.testing.assert_allclose(bundle.scaling.mean, mean, rtol=1e-5)
    np.testing.assert_allclose(bundle.scaling.std, std, rtol=1e-5)
    expected = standardised(arrays["test"], mean, std)
    np.testing.assert_allclose(bundle.test.inputs.numpy(), expected, rtol=0, atol=1e-4)
    # new raw images are prepared exactly as the stored ones
    encoded, mask = bundle.encode(arrays["test"])
    assert mask is None
    assert torch.equal(encoded, bundle.test.inputs)
    # the OOD set without y: no labels, the same scaling
    ood = bundle.ood["noise"]
    assert ood.labels.tolist() == [NO_LABEL] * 5
    np.testing.assert_allclose(
        ood.inputs.numpy(), standardised(arrays["ood"], mean, std), rtol=0, atol=1e-4
    )


def test_npz_images_without_normalize_are_scaled_only(tmp_path):
    arrays = image_files(tmp_path)
    bundle = load_data(image_spec(tmp_path, normalize=False))
    assert (bundle.scaling.mean, bundle.scaling.std) == (None, None)
    expected = torch.from_numpy(arrays["test"] / 255.0).float()
    torch.testing.assert_close(bundle.test.inputs, expected, rtol=0, atol=1e-7)
    assert torch.equal(bundle.encode(arrays["test"])[0], bundle.test.inputs)
    assert float(bundle.train.inputs.max()) <= 1.0


def test_each_file_is_scaled_by_its_own_pixels(tmp_path):
    """8-bit pixels are divided by 255 and float pixels taken as they are, whatever the
    training file held; float pixels above 1 for a run of 8-bit images are refused."""
    arrays = image_files(tmp_path)
    bundle = load_data(image_spec(tmp_path))
    as_floats = arrays["test"].astype(np.float32) / np.float32(255)
    assert torch.equal(bundle.encode(as_floats)[0], bundle.test.inputs)
    with pytest.raises(ProbtransError, match=r"new.npz: float pixels up to 2\d\d.*8-bit"):
        bundle.encode(arrays["test"].astype(np.float32), "new.npz")
    with pytest.raises(ProbtransError, match=r"integer pixels in \[300, 300\]"):
        bundle.encode(np.full((1, 3, 32, 32), 300, dtype=np.int64))
    np.savez(tmp_path / "floats.npz", x=as_floats)  # an out-of-domain set of float pixels
    spec = image_spec(tmp_path)
    spec.ood[0].source = str(tmp_path / "floats.npz")
    assert torch.equal(load_data(spec).ood["noise"].inputs, bundle.test.inputs)


def test_three_dimensional_npz_images_have_one_channel(tmp_path):
    arrays = image_files(tmp_path, shape=(8, 8))
    bundle = load_data(image_spec(tmp_path))
    assert bundle.image_shape == (1, 8, 8)
    assert bundle.test.inputs.shape == (12, 1, 8, 8)
    mean = np.array([arrays["train"].mean() / 255.0])
    std = np.array([(arrays["train"] / 255.0).std(ddof=1)])
    expected = standardised(arrays["test"][:, None], mean, std)
    np.testing.assert_allclose(bundle.test.inputs.numpy(), expected, rtol=0, atol=1e-4)
    assert torch.equal(bundle.encode(arrays["test"])[0], bundle.test.inputs)


# ----------------------------------------------------------------------------- 9. digits-C
def test_corrupted_digits_are_the_test_split_corrupted():
    sets = [{"name": "noise3", "source": "digits-c:gaussian_noise:3"}]
    bundle = load_data(data_spec(kind=None, name="digits", split_seed=3, ood=sets))
    noise = bundle.ood["noise3"]
    assert torch.equal(noise.labels, bundle.test.labels)
    expected = corrupt(bundle.test.inputs.numpy(), "gaussian_noise", 3, seed=3)
    assert torch.equal(noise.inputs, torch.from_numpy(expected))
    assert not torch.equal(noise.inputs, bundle.test.inputs)
    assert set(bundle.ood) == {"digits_8_9", "noise3"}


def test_unknown_corruptions_and_corrupted_digits_of_files_are_refused(tmp_path):
    fog = [{"name": "fog", "source": "digits-c:fog:3"}]
    message = error(load_data, data_spec(kind=None, name="digits", ood=fog))
    assert message.startswith("corruption 'fog:3': unknown name 'fog'; one of brightness")
    too_strong = [{"name": "x", "source": "digits-c:gaussian_noise:9"}]
    message = error(load_data, data_spec(kind=None, name="digits", ood=too_strong))
    assert message == "corruption 'gaussian_noise:9': severity 9 must be in 1..5"
    x, y = cifar_like(20, 0, classes=2, shape=(8, 8))
    np.savez(tmp_path / "digits.npz", x=x, y=y)
    spec = data_spec(
        kind="image",
        train=str(tmp_path / "digits.npz"),
        val_fraction=0.25,
        test_fraction=0.25,
        ood=[{"name": "noise3", "source": "digits-c:gaussian_noise:3"}],
    )
    message = error(load_data, spec)
    assert message == (
        f"data.ood 'noise3': 'digits-c:gaussian_noise:3' corrupts the digits test split; this "
        f"data set is '{tmp_path / 'digits.npz'}'"
    )


# ----------------------------------------------------------------------------- 10. saved
def assert_same_split(mine: DataSplit, theirs: DataSplit) -> None:
    assert torch.equal(mine.inputs, theirs.inputs)
    assert mine.inputs.dtype == theirs.inputs.dtype
    assert torch.equal(mine.labels, theirs.labels)
    assert (mine.mask is None) == (theirs.mask is None)
    if mine.mask is not None:
        assert torch.equal(mine.mask, theirs.mask)


def test_a_text_bundle_round_trips_through_a_run_folder(tmp_path):
    spec_path, _ = example_project(tmp_path / "project")
    spec = load_model_spec(spec_path)
    bundle = load_data(spec.data, spec_folder(spec))
    save_bundle(tmp_path / "run", bundle, None)
    loaded = load_saved_bundle(tmp_path / "run", None)
    assert (loaded.name, loaded.kind, loaded.class_names) == (bundle.name, "tokens", ["neg", "pos"])
    assert loaded.vocab_size == bundle.vocab_size
    for split in ("val", "test"):
        assert_same_split(getattr(loaded, split), getattr(bundle, split))
    assert list(loaded.ood) == ["questions"]
    assert_same_split(loaded.ood["questions"], bundle.ood["questions"])
    assert len(loaded.train) == 0 and loaded.train.inputs.dtype == torch.long
    new = ["good plot indeed", "awful walrus film film film film"]
    for mine, theirs in zip(loaded.encode(new), bundle.encode(new), strict=True):
        assert torch.equal(mine, theirs)
    save_bundle(tmp_path / "with_train", bundle, None, with_train=True)
    assert_same_split(load_saved_bundle(tmp_path / "with_train", None).train, bundle.train)
    assert load_saved_bundle(tmp_path / "nothing", None) is None


def test_an_image_bundle_round_trips_with_its_scaling(tmp_path):
    arrays = image_files(tmp_path)
    bundle = load_data(image_spec(tmp_path))
    save_bundle(tmp_path / "run", bundle, None, with_train=True)
    loaded = load_saved_bundle(tmp_path / "run", None)
    assert loaded.scaling == bundle.scaling
    assert loaded.image_shape == (3, 32, 32)
    for split in ("train", "val", "test"):
        assert_same_split(getattr(loaded, split), getattr(bundle, split))
    assert_same_split(loaded.ood["noise"], bundle.ood["noise"])
    assert torch.equal(loaded.encode(arrays["ood"])[0], bundle.ood["noise"].inputs)
    packed = load_checkpoint(tmp_path / "run" / "data.pt")  # 8-bit pixels kept as such
    assert packed["test"]["pixels"].dtype == torch.uint8 and "inputs" not in packed["test"]
    raw_test = packed["test"]["pixels"].numpy()
    assert torch.equal(bundle.encode(raw_test)[0], bundle.test.inputs)


INNER_PADDING = torch.tensor([[5, 0, 3], [2, 2, 0], [7, 0, 0], [0, 4, 4], [1, 2, 3], [3, 0, 9]])


def test_inner_padding_round_trips_in_a_text_bundle(tmp_path):
    spec_path, _ = example_project(tmp_path / "project")
    spec = load_model_spec(spec_path)
    bundle = load_data(spec.data, spec_folder(spec))
    labels = torch.tensor([0, 1, 0, 1, 1, 0])
    bundle.test = DataSplit(INNER_PADDING.clone(), labels, INNER_PADDING != 0)
    save_bundle(tmp_path / "run", bundle, None)
    loaded = load_saved_bundle(tmp_path / "run", None)
    assert_same_split(loaded.test, bundle.test)
    assert loaded.test.mask.tolist()[0] == [True, False, True]


def test_token_ids_from_tensors_round_trip_with_inner_padding(tmp_path):
    ids = INNER_PADDING.repeat(4, 1)
    labels = torch.tensor([0, 1, 0, 1, 1, 0] * 4)
    bundle = DataBundle.from_tensors(
        (ids[:12], labels[:12]), (ids[12:18], labels[12:18]), (ids[18:], labels[18:])
    )
    assert bundle.tokenizer is None and bundle.kind == "tokens"
    save_bundle(tmp_path / "run", bundle, None)
    loaded = load_saved_bundle(tmp_path / "run", None)
    for split in ("val", "test"):
        assert_same_split(getattr(loaded, split), getattr(bundle, split))
    assert loaded.test.inputs.tolist() == INNER_PADDING.tolist()


# ----------------------------------------------------------------------------- 11. CIFAR-10
@pytest.mark.parametrize("name, attention", [("sgpa", "sgpa"), ("trans", "softmax")])
def test_the_cifar10_specs_read_the_hub_copies(name, attention):
    spec = load_model_spec(ROOT / "models" / "cifar10" / f"{name}.toml")
    data = spec.data
    assert (data.name, data.kind, data.patch_size) == ("files", "image", 4)
    assert (data.train, data.test, data.validation) == (
        "hf:uoft-cs/cifar10@train",
        "hf:uoft-cs/cifar10@test",
        None,
    )
    assert [(s.name, s.label_column) for s in data.ood] == [("svhn", "")]
    net = spec.network
    assert (net.n_layers, net.n_heads, net.d_model, net.attention.kind) == (5, 4, 128, attention)


def test_the_sgpa_cifar10_model_on_small_local_files(tmp_path):
    x, y = cifar_like(100, 0, classes=10)
    np.savez(tmp_path / "train.npz", x=x, y=y)
    np.savez(tmp_path / "test.npz", x=x[:20], y=y[:20])
    np.savez(tmp_path / "svhn.npz", x=cifar_like(4, 1)[0])
    spec = load_model_spec(ROOT / "models" / "cifar10" / "sgpa.toml")
    ood = [{"name": "svhn", "source": str(tmp_path / "svhn.npz"), "label_column": ""}]
    changes = {
        "data.train": str(tmp_path / "train.npz"),
        "data.test": str(tmp_path / "test.npz"),
        "data.ood": ood,
    }
    spec = updated(spec, changes, "test")
    bundle = load_data(spec.data)
    assert (len(bundle.train), len(bundle.val), len(bundle.test)) == (90, 10, 20)
    assert bundle.class_names == [str(c) for c in range(10)]
    assert bundle.ood["svhn"].labels.tolist() == [NO_LABEL] * 4
    classifier = build_classifier(spec, bundle)
    layers = classifier.encoder.layers
    assert len(layers) == 5
    for layer in layers:
        assert type(layer.attn).__name__ == "SGPAttention"
        assert layer.attn.n_heads == 4
        assert tuple(layer.attn.z_g.shape) == (4, 16, 128)  # heads, inducing points, width
    assert (classifier.head.in_features, classifier.head.out_features) == (128, 10)
    trace = pyro.poutine.trace(classifier).get_trace(bundle.test.inputs[:2])
    logits = trace.nodes["_RETURN"]["value"]
    assert logits.shape == (2, 10)
    assert torch.isfinite(logits).all()
    probs = trace.nodes["probs"]["value"]
    torch.testing.assert_close(probs, logits.softmax(-1))
    # and it trains, evaluates and predicts new raw images from its run folder
    import probtrans
    from tests.conftest import tiny_inference

    run = probtrans.fit(spec, tiny_inference(tmp_path, "sgpa"), out=tmp_path / "run", epochs=1)
    scores = run.metrics
    assert np.isfinite(scores["nll"]) and set(scores["ood"]) == {"svhn"}
    loaded = probtrans.Run.load(tmp_path / "run")
    columns = loaded.predict(x[:3], samples=2)
    assert list(columns)[:3] == ["predicted", "p_0", "p_1"] and len(columns["entropy"]) == 3
