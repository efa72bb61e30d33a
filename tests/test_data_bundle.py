"""In-memory data: ``DataBundle.from_tensors``, ``DataBundle.from_texts``, unlabelled splits and
the bundle's ``encode`` / ``decode`` of texts."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from probtrans.data import NO_LABEL, DataBundle, DataSplit, load_data
from probtrans.errors import ConfigError, ProbtransError
from probtrans.specs import DataSpec

SPLITS = ("train", "val", "test")


def images(n: int, classes: int = 3, shape: tuple[int, ...] = (8, 8), seed: int = 0):
    """n random images whose first pixel is the row number (to trace rows), labels 0..classes−1
    in turn."""
    x = np.random.default_rng(seed).random((n, *shape)).astype(np.float32)
    x.reshape(n, -1)[:, 0] = np.arange(n)
    return x, np.arange(n) % classes


def token_ids(n: int, length: int = 6, vocab: int = 30, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, vocab, (n, length), generator=generator)
    ids[:, length // 2 :] *= torch.arange(n)[:, None] % 2  # every other row half padding
    return ids


def sizes(bundle: DataBundle) -> dict[str, int]:
    """Split sizes; "ood" is the set of that name, as one out-of-domain set is named."""
    in_domain = {s: len(getattr(bundle, s)) for s in SPLITS}
    return in_domain | {"ood": len(bundle.ood["ood"]) if bundle.ood else 0}


# ----------------------------------------------------------------------------- DataSplit
def test_unlabelled_split_has_no_labels_and_a_mask_for_token_ids():
    ids = torch.tensor([[3, 4, 0], [5, 0, 0]])
    split = DataSplit.unlabelled(ids)
    assert split.labels.tolist() == [NO_LABEL, NO_LABEL] == [-1, -1]
    assert split.mask.tolist() == [[True, True, False], [True, False, False]]
    image_split = DataSplit.unlabelled(torch.zeros(2, 1, 4, 4))
    assert image_split.mask is None and image_split.labels.tolist() == [NO_LABEL, NO_LABEL]
    (_, inputs, mask, labels), *_ = split.batches(8)
    assert inputs.shape == (2, 2) and labels.tolist() == [-1, -1] and mask.shape == (2, 2)


# ----------------------------------------------------------------------------- from_tensors
def test_from_tensors_images_without_channel_split_off_val_and_test():
    x, y = images(100)
    bundle = DataBundle.from_tensors((x, y))
    assert bundle.kind == "image" and bundle.image_shape == (1, 8, 8)
    assert bundle.class_names == ["0", "1", "2"] and bundle.n_classes == 3
    assert sizes(bundle) == {"train": 60, "val": 20, "test": 20, "ood": 0}
    assert bundle.ood == {}
    for s in SPLITS:
        split = getattr(bundle, s)
        assert split.inputs.dtype == torch.float32 and split.mask is None
        assert split.labels.dtype == torch.long
    assert bundle.description["split_off_train"] == ["test", "val"]
    assert bundle.vocab_size is None and bundle.tokenizer is None
    # new images in the training pixels' range [0, 99] (pixel 0 numbers the rows), as given
    raw = (np.random.default_rng(0).random((2, 8, 8)) * 99).astype(np.float32)
    assert torch.equal(bundle.encode(raw)[0], torch.from_numpy(raw)[:, None])
    with pytest.raises(ProbtransError, match=r"images are \(N, 1, 8, 8\)"):
        bundle.encode(raw[:, :4])
    # every row lands in exactly one split, with its own label
    rows = torch.cat([getattr(bundle, s).inputs[:, 0, 0, 0] for s in ("train", "val", "test")])
    assert sorted(rows.long().tolist()) == list(range(100))
    for s in ("train", "val", "test"):
        split = getattr(bundle, s)
        assert torch.equal(split.inputs[:, 0, 0, 0].long() % 3, split.labels)


def test_from_tensors_given_splits_are_kept_and_ood_alone_has_no_labels():
    x, y = images(30, shape=(2, 5, 5))
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    bundle = DataBundle.from_tensors(
        (xt, yt), (xt[:6], yt[:6]), (xt[:9], yt[:9]), xt[:4], class_names=["a", "b", "c"]
    )
    assert sizes(bundle) == {"train": 30, "val": 6, "test": 9, "ood": 4}
    assert bundle.image_shape == (2, 5, 5) and bundle.class_names == ["a", "b", "c"]
    assert torch.equal(bundle.train.inputs, xt) and torch.equal(bundle.test.labels, yt[:9])
    assert bundle.ood["ood"].labels.tolist() == [-1] * 4
    assert bundle.description["split_off_train"] == []
    labelled_ood = DataBundle.from_tensors((x, y), ood=(x[:3], [2, -1, 0]))
    assert labelled_ood.ood["ood"].labels.tolist() == [2, -1, 0]


def test_from_tensors_token_ids():
    ids = token_ids(40)
    labels = torch.arange(40) % 2
    bundle = DataBundle.from_tensors((ids, labels), ood=ids[:5].int(), test_fraction=0.25)
    assert bundle.kind == "tokens" and bundle.image_shape is None
    assert bundle.vocab_size == int(ids.max()) + 1
    assert sizes(bundle) == {"train": 22, "val": 8, "test": 10, "ood": 5}
    for s in SPLITS:
        split = getattr(bundle, s)
        assert split.inputs.dtype == torch.long and torch.equal(split.mask, split.inputs != 0)
    assert bundle.ood["ood"].labels.tolist() == [-1] * 5
    assert DataBundle.from_tensors((ids, labels), vocab_size=100).vocab_size == 100
    assert DataBundle.from_tensors((ids.numpy(), labels.numpy())).ood == {}


def test_from_tensors_splits_are_seeded_and_stratified():
    x, y = images(200, classes=4)

    def rows(bundle: DataBundle, split: str) -> list[int]:
        return sorted(getattr(bundle, split).inputs[:, 0, 0, 0].long().tolist())

    first, again = DataBundle.from_tensors((x, y), seed=3), DataBundle.from_tensors((x, y), seed=3)
    other = DataBundle.from_tensors((x, y), seed=4)
    for s in ("train", "val", "test"):
        assert rows(first, s) == rows(again, s)
        assert (
            np.bincount(getattr(first, s).labels.numpy()).tolist() == [len(rows(first, s)) // 4] * 4
        )
    assert rows(first, "test") != rows(other, "test")
    # only val missing: a stratified val_fraction of train; test as given
    only_val = DataBundle.from_tensors((x, y), test=(x[:8], y[:8]), val_fraction=0.1, seed=1)
    assert sizes(only_val) == {"train": 180, "val": 20, "test": 8, "ood": 0}
    assert np.bincount(only_val.val.labels.numpy()).tolist() == [5] * 4
    assert only_val.description["split_off_train"] == ["val"]


# ----------------------------------------------------------------------------- from_texts
WORDS = ["good", "bad", "fine", "awful"]


def texts(n: int) -> tuple[list[str], list[str]]:
    """n texts with a word unique to each (``wN``), labels "pos"/"neg" in turn."""
    rows = [f"{WORDS[i % 4]} movie w{i}" for i in range(n)]
    return rows, ["pos" if i % 2 == 0 else "neg" for i in range(n)]


def test_from_texts_string_labels_sorted_and_splits():
    x, y = texts(40)
    bundle = DataBundle.from_texts((x, y), ood=["zebra crossing"], max_len=16)
    assert bundle.kind == "tokens" and bundle.class_names == ["neg", "pos"]
    assert sizes(bundle) == {"train": 24, "val": 8, "test": 8, "ood": 1}
    assert bundle.ood["ood"].labels.tolist() == [-1]
    assert bundle.description["max_len"] == 16
    # vocabulary: padding, unknown, the 4 words, "movie" and the 24 training-only words
    assert bundle.vocab_size == 2 + 4 + 1 + 24
    for s in SPLITS:
        split = getattr(bundle, s)
        assert split.inputs.dtype == torch.long and torch.equal(split.mask, split.inputs != 0)
    again = DataBundle.from_texts((x, y), ood=["zebra crossing"], max_len=16)
    assert torch.equal(bundle.test.inputs, again.test.inputs)
    assert np.bincount(bundle.test.labels.numpy()).tolist() == [4, 4]


def test_from_texts_explicit_label_order_and_integer_labels():
    x, y = texts(20)
    ordered = DataBundle.from_texts((x, y), labels=["pos", "neg"])
    assert ordered.class_names == ["pos", "neg"]
    first = ordered.train.inputs[ordered.train.labels == 0]  # "pos" rows: good, fine
    assert all(ordered.decode(row.tolist()).split()[0] in ("good", "fine") for row in first)
    ints = [0 if label == "neg" else 1 for label in y]
    assert DataBundle.from_texts((x, ints)).class_names == ["0", "1"]
    named = DataBundle.from_texts((x, np.array(ints)), labels=["negative", "positive"])
    assert named.class_names == ["negative", "positive"]
    assert torch.equal(named.train.labels, DataBundle.from_texts((x, ints)).train.labels)
    swapped = DataBundle.from_texts((x, ints), labels=[1, 0])  # values in class order
    assert swapped.class_names == ["1", "0"]
    first = swapped.train.inputs[swapped.train.labels == 0]  # value 1: "pos" rows
    assert all(swapped.decode(row.tolist()).split()[0] in ("good", "fine") for row in first)


def test_fit_says_how_many_training_texts_fill_max_len():
    """Texts longer than max_len are cut without a word from the tokenizer; fit says how many
    training texts fill every token (the cut ones among them), and nothing where none does."""
    from probtrans.runs.fitting import cut_texts_note

    x, y = texts(40)  # "good movie wN": 3 words
    x[0] = "good movie " + "very " * 10 + "long"  # 13 words
    given = {"val": (x[1:5], y[1:5]), "test": (x[1:5], y[1:5])}  # train: all 40
    note = cut_texts_note(DataBundle.from_texts((x, y), **given, max_len=4))
    assert note.startswith("data: 1 of 40 training texts (2.5 %) fill all data.max_len = 4 tokens")
    every = cut_texts_note(DataBundle.from_texts((x, y), **given, max_len=3))
    assert every.startswith("data: 40 of 40 training texts (100.0 %) fill all")
    assert cut_texts_note(DataBundle.from_texts((x, y), **given, max_len=16)) is None
    images = DataBundle.from_tensors((torch.rand(20, 1, 4, 4), torch.arange(20) % 2))
    assert cut_texts_note(images) is None


def test_from_texts_tokenizer_learned_on_train_only():
    train = (["good movie", "bad movie", "good film", "bad film"], ["pos", "neg", "pos", "neg"])
    val = (["good movie", "bad film"], ["pos", "neg"])
    test = (["zebra movie", "good zebra"], ["neg", "pos"])
    bundle = DataBundle.from_texts(train, val, test)
    ids, mask = bundle.encode(["zebra"])
    assert ids.tolist() == [[1]] and mask.tolist() == [[True]]  # unknown id
    assert bundle.test.inputs[:, :2].tolist() == [
        [1, bundle.encode(["movie"])[0].item()],
        [bundle.encode(["good"])[0].item(), 1],
    ]
    assert bundle.decode(bundle.test.inputs[0].tolist()) == "[UNK] movie"
    # split off train: the words of the rows that became val and test are unknown
    x, y = texts(40)
    split = DataBundle.from_texts((x, y))
    held_out = [split.decode(row.tolist()).split()[-1] for row in split.test.inputs]
    assert held_out == ["[UNK]"] * len(split.test)
    known = [split.decode(row.tolist()).split()[-1] for row in split.train.inputs]
    assert all(word.startswith("w") for word in known)


def test_encode_decode_round_trip_and_truncation():
    x, y = texts(30)
    bundle = DataBundle.from_texts((x, y), max_len=3)
    ids, mask = bundle.encode(["Good movie", "BAD"])
    assert ids.dtype == torch.long and mask.dtype == torch.bool
    assert ids.shape == (2, 2) and mask.tolist() == [[True, True], [True, False]]
    assert [bundle.decode(row.tolist()) for row in ids] == ["good movie", "bad"]
    long_ids, _ = bundle.encode(["good movie good movie good"])
    assert long_ids.shape == (1, 3)  # max_len
    empty_ids, empty_mask = bundle.encode([])
    assert empty_ids.shape == (0, 0) and empty_mask.shape == (0, 0)
    assert bundle.train.inputs.shape[1] <= 3


@pytest.mark.parametrize(
    "texts_in, message",
    [(["good", "   "], "encode: text 1 ('   ') has no words"), ("good", "not one string")],
)
def test_encode_errors(texts_in, message):
    x, y = texts(10)
    bundle = DataBundle.from_texts((x, y), val=(x[:2], y[:2]), test=(x[:2], y[:2]))
    with pytest.raises(ProbtransError, match=message.replace("(", r"\(").replace(")", r"\)")):
        bundle.encode(texts_in)


DATA = os.environ.get("PROBTRANS_DATA_DIR")


@pytest.mark.skipif(
    not DATA or not Path(DATA, "cola").is_dir(), reason="no staged CoLA under PROBTRANS_DATA_DIR"
)
def test_text_bundle_encodes_new_texts(tmp_path, monkeypatch):
    monkeypatch.setenv("PROBTRANS_CACHE_DIR", str(tmp_path))
    bundle = load_data(DataSpec(name="cola", max_len=100))
    train = bundle.train.inputs[0]
    train = train[train != 0]
    text = bundle.decode(train.tolist())  # words of the vocabulary, lower-cased
    ids, mask = bundle.encode([text.upper(), "Qwzx the."])
    assert torch.equal(ids[0, : len(train)], train) and torch.equal(mask, ids != 0)
    assert bundle.decode(ids[1].tolist()) == "[UNK] the ."
    again = load_data(DataSpec(name="cola", max_len=100))  # from the cache
    assert again.description["from_cache"]
    assert torch.equal(again.encode([text])[0][0], ids[0, : len(train)])


# ----------------------------------------------------------------------------- errors
X, Y = images(30)
IDS = token_ids(30)


def _with(array: np.ndarray, row: int, value) -> np.ndarray:
    array = array.copy()
    array.reshape(len(array), -1)[row, 0] = value
    return array


TENSOR_ERRORS = [
    (dict(train=X), "from_tensors: train must be a pair (x, y), got a ndarray"),
    (dict(train=(X, Y, Y)), "train must be a pair (x, y), got a tuple of length 3"),
    (dict(train=(np.array(["a", "b"]), [0, 1])), "train x: must hold numbers"),
    (dict(train=([[1, 2], [3]], [0, 1])), "train x: not an array"),
    (dict(train=(X, Y[:, None])), "train y: labels must be 1-D (N,), got shape (30, 1)"),
    (dict(train=(X, Y.astype(float))), "train y: labels must be integers, got dtype torch.float64"),
    (dict(train=(X > 0.5, Y)), "train x: dtype bool"),
    (dict(train=(X, Y), val=(IDS, Y)), "val x: dtype int64, but train x holds float images"),
    (dict(train=(IDS, Y), val=(X, Y)), "val x: dtype float, but train x holds integer token ids"),
    (dict(train=(X[:, 0], Y)), "train x: shape (30, 8); images must be (N, C, H, W) or (N, H, W)"),
    (dict(train=(_with(X, 3, np.nan), Y)), "train x: shape (30, 8, 8); holds NaN or infinite"),
    (dict(train=(IDS[:, None], Y)), "train x: shape (30, 1, 6); token ids must be (N, L)"),
    (dict(train=(_with(IDS.numpy(), 2, -4), Y)), "train x: shape (30, 6); token ids must be ≥ 0"),
    (dict(train=(IDS * (torch.arange(30) != 7)[:, None], Y)), "row 7 is all padding"),
    (dict(train=(X[:0], Y[:0])), "train x: shape (0, 8, 8); no rows"),
    (dict(train=(X, Y), test=(X[:5, :4], Y[:5])), "test x: images of shape (1, 4, 8) (C, H, W), "),
    (dict(train=(X, Y), ood=X[:4, None, :, :4]), "ood:ood x: images of shape (1, 8, 4)"),
    (dict(train=(X, Y[:29])), "train: x has 30 rows (shape (30, 8, 8)) but y has 29 labels"),
    (dict(train=(X, Y), ood=(X[:3], [0])), "ood:ood: x has 3 rows (shape (3, 8, 8)) but y has 1"),
    (dict(train=(X, Y * 0)), "the labels hold 1 class(es) (largest label 0)"),
    (dict(train=(X, Y), class_names="abc"), "class_names must be a list of names, not one string"),
    (dict(train=(X, Y), class_names=["a", "a", "b"]), "class_names = ['a', 'a', 'b']: must be"),
    (
        dict(train=(X, Y), class_names=["a", "b"]),
        "train y: shape (30,); label 2 at row 2 is outside the classes 0..1",
    ),
    (dict(train=(X, Y - 1)), "train y: shape (30,); label -1 at row 0 is outside the classes 0..1"),
    (
        dict(train=(X, Y), ood=(X[:2], [0, 3])),
        "ood y: shape (2,); label 3 at row 1 is outside the classes -1..2 (−1: no class)",
    ),
    (dict(train=(IDS, Y), vocab_size=10), "train x: token id 29 is outside vocab_size = 10"),
    (dict(train=(X, Y), seed=-1), "seed = -1: must be an integer in 0 … 2**32 − 1"),
    (dict(train=(X, Y), val_fraction=0.0), "val_fraction = 0.0: must be in (0, 1)"),
    (dict(train=(X, Y), val_fraction=0.5, test_fraction=0.5), "val_fraction + test_fraction = 1"),
    (
        dict(train=(X[:4], [0, 1, 2, 2])),
        "cannot split test (test_fraction = 0.2) off train (4 rows) stratified by class: ",
    ),
]


@pytest.mark.parametrize("kwargs, message", TENSOR_ERRORS)
def test_from_tensors_errors(kwargs, message):
    with pytest.raises(ProbtransError) as err:
        DataBundle.from_tensors(**kwargs)
    text = str(err.value)
    assert text.startswith("DataBundle.from_tensors: ") and message in text, text
    assert "\n" not in text


TX, TY = texts(20)

TEXT_ERRORS = [
    (dict(train=(TX, TY), max_len=0), "DataBundle.from_texts: max_len = 0: must be > 0"),
    (dict(train=(TX, TY), vocab_size=2), "DataBundle.from_texts: vocab_size = 2: must be >= 3"),
    (dict(train=(TX, TY), seed=-3), "DataBundle.from_texts: split_seed = -3: must be >= 0"),
    (dict(train=TX), "train must be a pair (x, y), got a list of length 20"),
    (dict(train=("good movie", TY)), "train texts: must be a list of strings, got a str"),
    (dict(train=([*TX[:5], 7, *TX[6:]], TY)), "train texts[5]: a int, not a string"),
    (dict(train=([*TX[:2], None, *TX[3:]], TY)), "train texts[2]: missing (None), not a string"),
    (dict(train=(np.zeros((20, 4)), TY)), "train texts: must be a list of strings, got numbers"),
    (dict(train=(np.array([TX] * 3).T, TY)), "an array of texts of shape (20, 3): give N texts"),
    (dict(train=([*TX[:3], " ", *TX[4:]], TY)), "train texts[3]: empty text"),
    (dict(train=([], [])), "train texts: no texts"),
    (dict(train=(TX, TY[:-1])), "train: 20 texts but 19 labels"),
    (dict(train=(TX, "pos")), "train labels: must be a list of labels, got a str"),
    (dict(train=(TX, [0.0] * 20)), "train labels[0]: label 0.0 is a float; labels are strings or"),
    (dict(train=(TX, [*TY[:4], 1, *TY[5:]])), "train labels[4] = 1: labels mix strings and"),
    (dict(train=(TX, TY), labels="pos"), "labels must be a list of classes, not one string"),
    (dict(train=(TX, TY), labels=["pos", "pos"]), "labels = ['pos', 'pos']: lists 'pos' twice"),
    (dict(train=(TX, TY), labels=["pos"]), "labels = ['pos']: must be at least 2 classes"),
    (
        dict(train=(TX, TY), labels=["neg", "pos", "meh"]),
        "class 'meh' of the classes ['neg', 'pos', 'meh'] has no training example",
    ),
    (
        dict(train=(TX, [1 + (y == "pos") for y in TY])),
        "class '0' of the classes ['0', '1', '2'] has no training example (integer labels",
    ),
    (
        dict(train=(TX, TY), labels=["pos", "other"]),
        "train labels[1] = 'neg': not one of the classes ['pos', 'other']",
    ),
    (
        dict(train=(TX, TY), test=(TX[:2], ["pos", "meh"])),
        "test labels[1] = 'meh': not one of the classes ['neg', 'pos'] (the train labels; ",
    ),
    (
        dict(train=(TX, [i % 3 for i in range(20)]), labels=["a", "b"]),
        "train labels[2] = 2: not one of the classes 0..1",
    ),
    (dict(train=(TX, [-1] * 20)), "the labels hold the single class"),
    (dict(train=(TX, ["pos"] * 20)), "the labels hold the single class ['pos']"),
    (dict(train=(TX, TY), ood=["fine", ""]), "ood:ood texts[1]: empty text"),
    (dict(train=(TX, TY), test_fraction=1.5), "test_fraction = 1.5: must be in (0, 1)"),
]


@pytest.mark.parametrize("kwargs, message", TEXT_ERRORS)
def test_from_texts_errors(kwargs, message):
    with pytest.raises(ProbtransError) as err:
        DataBundle.from_texts(**kwargs)
    text = str(err.value)
    assert text.startswith("DataBundle.from_texts: ") and message in text, text
    assert "\n" not in text
    if "must be >" in message:
        assert isinstance(err.value, ConfigError)


# ------------------------------------------------------------------ new images against training


def bundle_of_images(scale: float, seed: int = 0) -> DataBundle:
    """Random float images (40, 1, 4, 4) with pixels in [0, scale], two classes."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(40, 1, 4, 4, generator=generator) * scale
    return DataBundle.from_tensors((x, torch.arange(40) % 2))


def test_new_images_in_another_scale_are_refused_with_both_ranges():
    unit = bundle_of_images(1.0)
    low, high = unit.pixel_range()
    assert 0 <= low < 0.05 and 0.95 < high <= 1
    with pytest.raises(
        ProbtransError, match=r"pixels in \[0, 16\], but the training images' were in \[0"
    ):
        unit.encode(torch.linspace(0, 16, 48).reshape(3, 4, 4))
    sixteen = bundle_of_images(16.0)
    with pytest.raises(ProbtransError, match=r"pixels in \[0, 1\], but the training images' were"):
        sixteen.encode(torch.linspace(0, 1, 48).reshape(3, 4, 4))  # the reverse
    inputs, _ = unit.encode(torch.linspace(0, 1, 48).reshape(3, 4, 4))  # the same scale: taken
    assert inputs.shape == (3, 1, 4, 4)
    unit.encode(torch.zeros(2, 4, 4))  # a constant (blank) image passes


def test_boolean_images_are_refused():
    with pytest.raises(ProbtransError, match="boolean pixels; give 8-bit integers"):
        bundle_of_images(1.0).encode(torch.rand(2, 4, 4) > 0.5)


def test_uint8_images_are_images_when_declared_and_refused_as_ambiguous_otherwise():
    pixels = torch.randint(0, 256, (40, 1, 4, 4), generator=torch.Generator().manual_seed(0))
    labels = torch.arange(40) % 2
    with pytest.raises(ProbtransError, match="dtype uint8: 8-bit images\\? pass kind='image'"):
        DataBundle.from_tensors((pixels.to(torch.uint8), labels))
    bundle = DataBundle.from_tensors((pixels.to(torch.uint8).numpy(), labels), kind="image")
    assert bundle.kind == "image" and bundle.scaling.eight_bit
    assert float(bundle.train.inputs.max()) <= 1.0  # scaled to [0, 1]
    new = pixels[:3].to(torch.uint8)
    inputs, _ = bundle.encode(new)  # 8-bit images of the same scale
    torch.testing.assert_close(inputs, new.float() / 255)


def test_a_saved_bundle_keeps_the_pixel_range(tmp_path):
    from probtrans.data.saved import load_saved_bundle, save_bundle

    unit = bundle_of_images(1.0)
    save_bundle(tmp_path, unit, None)
    saved = load_saved_bundle(tmp_path, None)
    assert saved.scaling.pixel_range == pytest.approx(unit.pixel_range())
    with pytest.raises(ProbtransError, match="but the training images' were"):
        saved.encode(torch.linspace(0, 255, 48).reshape(3, 4, 4))
