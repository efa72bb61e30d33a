"""Text data: the papers' split protocols, the training-only vocabulary, padding, the on-disk
cache and row validation. Tests on the real data need ``$PROBTRANS_DATA_DIR`` (the staged copies
of IMDB, CR and CoLA); IMDB is only read and split here, never tokenised (too slow for a test)."""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import pre_tokenizers

from probtrans.cli import main
from probtrans.data import load_data, text_bundle, tokenizer
from probtrans.data.files import parse_source, read_texts
from probtrans.data.text import load_text_task, read_source, split_indices, split_sizes
from probtrans.errors import ConfigError, ProbtransError
from probtrans.resolve import load_model_spec
from probtrans.specs import DataSpec
from probtrans.storage.checkpoint import load_checkpoint, save_checkpoint
from tests.test_bad_inputs import TINY_TEXT_MODEL, good_cola

ROOT = Path(__file__).resolve().parents[1]
DATA = os.environ.get("PROBTRANS_DATA_DIR")
needs_data = pytest.mark.skipif(
    not DATA or not Path(DATA, "cola").is_dir(),
    reason="PROBTRANS_DATA_DIR is unset or has no staged text data (imdb/, cr/, cola/)",
)


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    """A private cache folder for the whole session."""
    with pytest.MonkeyPatch.context() as mp:
        path = tmp_path_factory.mktemp("cache")
        mp.setenv("PROBTRANS_CACHE_DIR", str(path))
        yield path


def cola_spec(protocol: str = "h_sto", seed: int = 0, **kw) -> DataSpec:
    return DataSpec(name="cola", protocol=protocol, split_seed=seed, **{"max_len": 100, **kw})


@pytest.fixture(scope="session")
def cola(cache):
    return load_data(cola_spec())


# ------------------------------------------------------------------------- without the data
@pytest.mark.parametrize(
    "name, protocol, n, sizes",
    [
        ("imdb", "h_sto", 25_000, (22_500, 2_500, 0)),
        ("imdb", "sgpa", 50_000, (35_000, 5_000, 10_000)),
        ("cola", "h_sto", 9_078, (6_354, 908, 1_816)),
        ("cola", "sgpa", 9_078, (6_355, 907, 1_816)),
        ("cr", "h_sto", 3_775, (2_642, 378, 755)),
    ],
)
def test_protocol_sizes_and_disjoint_indices(name, protocol, n, sizes):
    assert split_sizes(name, protocol, n) == sizes
    parts = split_indices(name, protocol, 0, n)
    assert tuple(len(p) for p in parts) == sizes
    assert np.array_equal(np.sort(np.concatenate(parts)), np.arange(n))  # disjoint, complete
    again = split_indices(name, protocol, 0, n)
    other = split_indices(name, protocol, 1, n)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again, strict=True))
    assert not np.array_equal(parts[0], other[0])


def read_labelled_file(path: Path):
    """A file read as the built-in IMDB/CR/CoLA files are: labels 0 or 1."""
    return read_texts(parse_source(str(path)), classes=2)


def test_text_spec_fields(tmp_path):
    for name in ("imdb", "cola"):
        for protocol in ("h_sto", "sgpa"):
            spec = load_model_spec(ROOT / f"models/{name}/{protocol}.toml")
            assert (spec.data.name, spec.data.protocol) == (name, protocol)
    spec = load_model_spec(ROOT / "models/imdb/h_sto.toml")
    fields = (spec.data.protocol, spec.data.max_len, spec.network.attention.tau2)
    assert fields == ("h_sto", 512, 20)
    bad = tmp_path / "bad.toml"
    bad.write_text('[data]\nname = "cola"\nmax_len = 200\n[model]\nmax_positions = 100\n')
    with pytest.raises(
        ConfigError, match=r"bad.toml: data.max_len = 200: .*model.max_positions = 100"
    ):
        load_model_spec(bad)
    bad.write_text('[data]\nname = "cola"\nprotocol = "other"\n')
    with pytest.raises(ConfigError, match=r"bad.toml: data.protocol = 'other'"):
        load_model_spec(bad)


def test_malformed_tsv_rows_named_by_file_and_line(tmp_path):
    path = tmp_path / "rows.tsv"
    path.write_bytes(
        b"text\tlabel\n"
        b"a fine sentence\t1\n"
        b"no label here\t\n"
        b"label out of range\t3\n"
        b"  \t0\n"
        b"caf\xe9 latin-1\t1\n"
        b"last good one\t0\n"
    )
    with pytest.raises(ProbtransError) as err:
        read_labelled_file(path)
    message = str(err.value)
    for line, what in [
        (3, "'label' is missing"),
        (4, "'label' is 3, outside the classes 0..1"),
        (5, "'text' is empty"),
        (6, "not valid UTF-8"),
    ]:
        assert f"{path}:{line}: {what}" in message
    assert f"{path}:2:" not in message and f"{path}:7:" not in message


def test_malformed_jsonl_rows_named_by_file_and_line(tmp_path):
    path = tmp_path / "rows.jsonl.gz"
    lines = [
        json.dumps({"text": "good", "label": 0}).encode(),
        json.dumps({"text": "no label"}).encode(),
        json.dumps({"text": "three", "label": 3}).encode(),
        json.dumps({"text": "", "label": 1}).encode(),
        b'{"text": "bad \xff bytes", "label": 1}',
        b"{not json",
        json.dumps({"label": 1}).encode(),
    ]
    path.write_bytes(gzip.compress(b"\n".join(lines) + b"\n"))
    with pytest.raises(ProbtransError) as err:
        read_labelled_file(path)
    message = str(err.value)
    for line, what in [
        (2, "'label' is missing"),
        (3, "'label' is 3, outside"),
        (4, "'text' is empty"),
        (5, "not valid UTF-8"),
        (6, "not a JSON object"),
    ]:
        assert f"{path}:{line}: {what}" in message
    assert "(and 1 more malformed rows)" in message  # line 7, beyond the first five
    good = tmp_path / "good.jsonl"
    good.write_text(lines[0].decode() + "\n")
    rows = read_labelled_file(good)
    assert rows.values == ["good"] and rows.labels == [0]


@pytest.mark.parametrize("damage", ["tokenizer", "labels", "ids"])
def test_a_damaged_part_of_a_cache_file_is_set_aside_and_rebuilt(
    tmp_path, monkeypatch, capsys, damage
):
    """Every part of a cache file is checked when read: a cached tokenizer that does not parse,
    labels of another length, ids that are not integers: it is set aside and rebuilt."""
    for name, content in good_cola().items():
        (tmp_path / "data" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "data" / name).write_bytes(content)
    monkeypatch.setenv("PROBTRANS_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("PROBTRANS_CACHE_DIR", str(tmp_path / "cache"))
    model = tmp_path / "text.toml"
    model.write_text(TINY_TEXT_MODEL.format(name="cola"))
    assert main(["describe", str(model)]) == 0
    (path,) = (tmp_path / "cache").glob("cola-*.pt")
    payload = load_checkpoint(path)
    if damage == "tokenizer":
        payload["tokenizer"] = payload["tokenizer"][: len(payload["tokenizer"]) // 2]
    elif damage == "labels":
        payload["val_labels"] = payload["val_labels"][:-1]
    else:
        payload["train_ids"] = payload["train_ids"].float()
    save_checkpoint(path, payload)
    damaged = path.read_bytes()
    capsys.readouterr()
    assert main(["describe", str(model)]) == 0
    err = capsys.readouterr().err
    assert f"note: cache {path}: damaged content" in err and "rebuilt" in err, err
    assert path.with_name(path.name + ".unreadable").read_bytes() == damaged
    assert main(["describe", str(model)]) == 0
    assert "note:" not in capsys.readouterr().err  # the rebuilt cache is read next time


# ---------------------------------------------------------------------------- with the data
@needs_data
def test_imdb_sizes_and_balance():
    train, test, cr = read_source("imdb/train"), read_source("imdb/test"), read_source("cr/test")
    assert (len(train), len(test), len(cr)) == (25_000, 25_000, 500)
    labels = np.array(train["label"])
    tr, va, te = split_indices("imdb", "h_sto", 0, len(train))
    assert (len(tr), len(va), len(te)) == (22_500, 2_500, 0)
    for rows in (tr, va):
        assert abs(labels[rows].mean() - 0.5) < 0.03
    pooled = np.concatenate([labels, np.array(test["label"])])
    parts = split_indices("imdb", "sgpa", 0, len(pooled))
    assert tuple(len(p) for p in parts) == (35_000, 5_000, 10_000)
    for rows in parts:
        assert abs(pooled[rows].mean() - 0.5) < 0.03


@needs_data
@pytest.mark.parametrize(
    "protocol, sizes", [("h_sto", (6354, 908, 1816)), ("sgpa", (6355, 907, 1816))]
)
def test_cola_bundle(cache, protocol, sizes):
    bundle = load_data(cola_spec(protocol))
    assert (bundle.kind, bundle.class_names) == ("tokens", ["unacceptable", "acceptable"])
    assert tuple(len(s) for s in (bundle.train, bundle.val, bundle.test)) == sizes
    assert len(bundle.ood["cola_ood"]) == 516
    assert bundle.ood["cola_ood"].labels.sum().item() == 354  # labels kept as in the file
    for split in (bundle.train, bundle.val, bundle.test):
        assert abs(split.labels.float().mean().item() - 0.70) < 0.04  # 6388 / 9078 acceptable
        assert split.inputs.dtype == torch.long and split.inputs.max() < bundle.vocab_size


@needs_data
def test_cr_pools_its_three_files_and_takes_cola_out_of_domain_as_ood(cache):
    files = [read_source(key) for key in ("cr/train", "cr/dev", "cr/test")]
    assert [len(f) for f in files] == [2_775, 500, 500]
    bundle = load_data(DataSpec(name="cr", max_len=64))
    assert (bundle.kind, bundle.class_names) == ("tokens", ["negative", "positive"])
    assert tuple(len(s) for s in (bundle.train, bundle.val, bundle.test)) == (2_642, 378, 755)
    assert list(bundle.ood) == ["cola_ood"] and len(bundle.ood["cola_ood"]) == 516
    positive = sum(sum(f["label"]) for f in files) / 3_775
    for split in (bundle.train, bundle.val, bundle.test):
        assert abs(split.labels.float().mean().item() - positive) < 0.04
    assert bundle.description["ood"] == "CoLA out-of-domain dev"


@needs_data
def test_padding_mask_and_truncation(cola, cache):
    for split in (cola.train, cola.test, cola.ood["cola_ood"]):
        ids, mask = split.inputs, split.mask
        assert mask.dtype == torch.bool and torch.equal(mask, ids != 0)
        lengths = mask.sum(1)
        assert lengths.min() > 0 and lengths.max() == ids.shape[1]  # padded to the longest
        positions = torch.arange(ids.shape[1])
        assert torch.equal(mask, positions < lengths[:, None])  # padding only at the end
    short = load_data(cola_spec(max_len=8))
    assert short.train.inputs.shape[1] == 8 and short.train.mask[:, -1].any()


@needs_data
def test_decode_gives_back_the_words_the_model_sees(cola):
    task = load_text_task("cola", "h_sto", 0)
    text = task.train["text"][0]
    words = [w for w, _ in pre_tokenizers.Whitespace().pre_tokenize_str(text.lower())]
    assert cola.decode(cola.train.inputs[0].tolist()) == " ".join(words)
    unseen = (
        (cola.ood["cola_ood"].inputs == 1).any(1).nonzero()[0, 0]
    )  # a sentence with an unknown word
    assert "[UNK]" in cola.decode(cola.ood["cola_ood"].inputs[unseen].tolist())


@needs_data
def test_vocabulary_is_learned_on_train_only(cola):
    task = load_text_task("cola", "h_sto", 0)
    trained = tokenizer.train_tokenizer(task.train["text"], cola_spec(), False)
    vocab = trained.get_vocab()
    assert (vocab["[PAD]"], vocab["[UNK]"]) == (0, 1) and len(vocab) == cola.vocab_size
    train_words = {
        t
        for text in task.train["text"]
        for t, _ in trained.pre_tokenizer.pre_tokenize_str(text.lower())
    }
    assert set(vocab) - {"[PAD]", "[UNK]"} == train_words
    for i, text in enumerate(task.test["text"]):
        words = [t for t, _ in trained.pre_tokenizer.pre_tokenize_str(text.lower())]
        unseen = [k for k, w in enumerate(words) if w not in train_words]
        if unseen:
            assert (cola.test.inputs[i, unseen] == 1).all()
            assert (cola.test.inputs[i, : len(words)] != 1).sum() == len(words) - len(unseen)
            break
    else:
        pytest.fail("no test sentence with a word unseen in training")


@needs_data
def test_determinism_per_seed(cola, cache, tmp_path, monkeypatch):
    monkeypatch.setenv("PROBTRANS_CACHE_DIR", str(tmp_path))  # recomputed, not read back
    same = load_data(cola_spec())
    assert not same.description["from_cache"]
    for a, b in (
        (cola.train, same.train),
        (cola.test, same.test),
        (cola.ood["cola_ood"], same.ood["cola_ood"]),
    ):
        assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)
    other = load_data(cola_spec(seed=1))
    assert len(other.train) == len(cola.train)
    assert not torch.equal(other.train.labels, cola.train.labels)


@needs_data
def test_second_load_comes_from_the_cache(cola, cache, monkeypatch):
    def fail(*args, **kwargs):
        raise AssertionError("tokenizer trained again")

    monkeypatch.setattr(text_bundle, "train_tokenizer", fail)
    again = load_data(cola_spec())
    assert again.description["from_cache"]
    assert torch.equal(again.train.inputs, cola.train.inputs)
    assert torch.equal(again.val.mask, cola.val.mask)
    assert Path(again.description["cache"]).parent == cache
