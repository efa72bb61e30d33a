"""Encoder: text and image embeddings, pre/post-LN, pooling, padding never leaks."""

from __future__ import annotations

import pyro
import pytest
import torch

from probtrans.data import DataBundle, DataSplit
from probtrans.errors import ProbtransError
from probtrans.model import build_classifier
from tests.conftest import tiny_spec


def token_bundle(n: int = 6, length: int = 7, vocab: int = 20) -> DataBundle:
    ids = torch.randint(1, vocab, (n, length))
    mask = torch.ones(n, length, dtype=torch.bool)
    mask[0, 4:] = False
    ids[~mask] = 0
    split = DataSplit(ids, torch.randint(0, 2, (n,)), mask)
    return DataBundle("toy", split, split, split, split, ["neg", "pos"], "tokens", vocab_size=vocab)


@pytest.mark.parametrize("kind", ["softmax", "sto", "h_sto"])
@pytest.mark.parametrize("norm,pooling", [("pre", "mean"), ("post", "first")])
def test_padding_tokens_do_not_change_the_prediction(kind, norm, pooling):
    data = token_bundle()
    spec = tiny_spec(kind)
    spec.model.norm, spec.model.pooling, spec.model.max_len = norm, pooling, 16
    classifier = build_classifier(spec, data).eval()
    ids, mask = data.train.inputs, data.train.mask
    other = ids.clone()
    other[0, 4:] = 5  # different content under the padding
    pyro.set_rng_seed(0)
    logits = classifier(ids, mask)
    pyro.set_rng_seed(0)
    torch.testing.assert_close(classifier(other, mask)[0], logits[0])
    assert logits.shape == (6, 2) and torch.isfinite(logits).all()


def test_too_long_sequences_are_refused_with_the_field_name():
    data = token_bundle(length=9)
    spec = tiny_spec("softmax")
    spec.model.max_len = 8
    with pytest.raises(ProbtransError, match="model.max_len = 8"):
        build_classifier(spec, data)(data.train.inputs, data.train.mask)


def test_image_patches_cover_the_image(digits):
    spec = tiny_spec("softmax")
    classifier = build_classifier(spec, digits)
    tokens = classifier.encoder.embedding(digits.test.inputs[:4])
    assert tokens.shape == (4, 16, spec.model.d_model)
    spec.data.patch_size = 3
    with pytest.raises(ProbtransError, match="patch_size = 3"):
        build_classifier(spec, digits)
