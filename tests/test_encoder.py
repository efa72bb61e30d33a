"""The classifier's network: text and image embeddings, pre/post-LN, pooling, padding never
leaks."""

from __future__ import annotations

import pyro
import pytest
import torch

from probtrans.classifier import build_classifier
from probtrans.data import DataBundle, DataSplit
from probtrans.errors import ProbtransError
from tests.conftest import ragged_split, tiny_spec


def token_bundle(n: int = 6, length: int = 7, vocab: int = 20) -> DataBundle:
    ids = torch.randint(1, vocab, (n, length))
    mask = torch.ones(n, length, dtype=torch.bool)
    mask[0, 4:] = False
    ids[~mask] = 0
    split = DataSplit(ids, torch.randint(0, 2, (n,)), mask)
    return DataBundle("toy", split, split, split, split, ["neg", "pos"], "tokens", vocab_size=vocab)


@pytest.mark.parametrize("kind", ["softmax", "sto", "h_sto"])
@pytest.mark.parametrize("norm,pooling", [("pre", "mean"), ("post", "first")])
def test_padding_tokens_do_not_change_the_prediction(kind, norm, pooling, device):
    data = token_bundle()
    spec = tiny_spec(kind)
    spec.network.norm, spec.network.pooling, spec.network.max_positions = norm, pooling, 16
    classifier = build_classifier(spec, data).to(device).eval()
    ids, mask = data.train.inputs.to(device), data.train.mask.to(device)
    other = ids.clone()
    other[0, 4:] = 5  # different content under the padding
    pyro.set_rng_seed(0)
    logits = classifier(ids, mask)
    pyro.set_rng_seed(0)
    torch.testing.assert_close(classifier(other, mask)[0], logits[0])
    assert logits.shape == (6, 2) and torch.isfinite(logits).all()


def test_batches_drop_all_padding_columns_without_changing_the_prediction():
    """Deterministic attention, so outputs compare exactly (stochastic kinds draw per column)."""
    ids = torch.randint(1, 20, (4, 9))
    mask = torch.zeros(4, 9, dtype=torch.bool)
    for row, length in enumerate([3, 5, 2, 4]):
        mask[row, :length] = True
    ids[~mask] = 0
    split = DataSplit(ids, torch.zeros(4, dtype=torch.long), mask)
    data = DataBundle("toy", split, split, split, split, ["a", "b"], "tokens", vocab_size=20)
    spec = tiny_spec("softmax")
    spec.network.max_positions = 16
    classifier = build_classifier(spec, data).eval()

    (index_a, inputs_a, mask_a, _), (index_b, inputs_b, mask_b, _) = split.batches(2)
    assert inputs_a.shape == (2, 5) and inputs_b.shape == (2, 4)  # longest real sequence
    for index, inputs, cut_mask in [(index_a, inputs_a, mask_a), (index_b, inputs_b, mask_b)]:
        with torch.no_grad():
            full = classifier.encode(ids[index], mask[index])
            cut = classifier.encode(inputs, cut_mask)
        torch.testing.assert_close(cut, full)


def padded_cells(batches) -> int:
    return sum(inputs.numel() for _, inputs, _, _ in batches)


def test_length_grouped_batches_cover_every_row_once_with_less_padding():
    split = ragged_split(n=2000, longest=100)

    def shuffled(seed: int, by_length: bool) -> list:
        generator = torch.Generator().manual_seed(seed)
        return list(split.batches(16, shuffle=True, generator=generator, by_length=by_length))

    plain, grouped = shuffled(1, by_length=False), shuffled(1, by_length=True)
    rows = torch.cat([index for index, *_ in grouped])
    assert torch.equal(rows.sort().values, torch.arange(2000))  # every row exactly once
    assert sorted(len(index) for index, *_ in grouped) == sorted(len(i) for i, *_ in plain)
    for index, inputs, mask, _ in grouped:
        assert torch.equal(mask, split.mask[index, : inputs.shape[1]])
        assert mask[:, -1].any()  # trimmed to the longest row of the batch
    # uniform lengths: plain batches are padded to about the maximum, grouped ones barely at all
    real = int(split.lengths().sum())
    assert padded_cells(plain) > 1.7 * real
    assert padded_cells(grouped) < 1.1 * real
    again, other = shuffled(1, by_length=True), shuffled(2, by_length=True)
    assert all(torch.equal(a[0], b[0]) for a, b in zip(grouped, again, strict=True))
    assert not all(torch.equal(a[0], b[0]) for a, b in zip(grouped, other, strict=True))


def test_unshuffled_length_grouped_batches_come_in_order_of_length():
    split = ragged_split(n=300, longest=40)
    rows = torch.cat([index for index, *_ in split.batches(32, by_length=True)])
    assert (split.lengths()[rows].diff() >= 0).all()


def test_too_long_sequences_are_refused_with_the_field_name():
    data = token_bundle(length=9)
    spec = tiny_spec("softmax")
    spec.network.max_positions = 8
    with pytest.raises(ProbtransError, match="model.max_positions = 8"):
        build_classifier(spec, data)(data.train.inputs, data.train.mask)


def test_image_patches_cover_the_image(digits):
    spec = tiny_spec("softmax")
    classifier = build_classifier(spec, digits)
    tokens = classifier.embedding(digits.test.inputs[:4])
    assert tokens.shape == (4, 16, spec.network.d_model)
    spec.data.patch_size = 3
    with pytest.raises(ProbtransError, match="patch_size = 3"):
        build_classifier(spec, digits)
