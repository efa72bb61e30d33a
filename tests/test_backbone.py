"""Pretrained Hugging Face backbones (:mod:`probtrans.backbone`, :mod:`probtrans.hub`): swapped
attention against the unmodified model, STO / Gaussian-mixture / SGPA in pretrained blocks, LoRA
guides with a frozen backbone, run folders that rebuild offline, the backbone's tokenizer. The
backbones are the tiny random models of :mod:`tests.tiny_backbones`."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import warnings
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pyro
import pytest
import torch
from pyro import poutine
from pyro.nn import PyroModule
from tokenizers import Tokenizer

import probtrans
from probtrans.backbone.replicas import block_stack, once_below_randomness
from probtrans.backbone.swap import attention_blocks, sampled_blocks, swap_blocks
from probtrans.classifier import BackboneClassifier, build_classifier
from probtrans.data import DataSplit, load_data
from probtrans.errors import ConfigError, ProbtransError
from probtrans.inference.predictive import sample_predictive
from probtrans.resolve import load_model_spec, spec_folder, with_local_backbone
from probtrans.runs.describe import site_table
from tests.conftest import tiny_inference
from tests.tiny_backbones import (
    ENCODER_DECODERS,
    TEXT_FAMILIES,
    TEXTS,
    TINY_SIZES,
    save_tiny_backbone,
    save_tiny_gpt2,
)

FAMILIES = (*TEXT_FAMILIES, "vit")
#: texts of different lengths, so that a batch of them is padded
PADDED_TEXTS = ["the film was wonderful and the actors were great", "bad", "a dull movie"]
#: the swapped top block of the tiny BERT, as its sites are named in a classifier
TOP = "backbone.encoder.layer.1.attention.self"


@pytest.fixture(scope="module")
def backbones(tmp_path_factory):
    """family → the folder of its tiny pretrained model (written once per module)."""
    root = tmp_path_factory.mktemp("backbones")
    return {family: save_tiny_backbone(family, root / family) for family in FAMILIES}


def model_inputs(family: str, folder: Path) -> dict[str, torch.Tensor]:
    """The inputs of the Hugging Face model: a padded batch of texts (its own tokenizer) or
    three random 1×8×8 images."""
    if family == "vit":
        return {"pixel_values": torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(0))}
    from transformers import AutoTokenizer

    batch = AutoTokenizer.from_pretrained(folder)(PADDED_TEXTS, padding=True, return_tensors="pt")
    assert not batch["attention_mask"].bool().all()  # some padding
    return {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}


def pretrained(folder: Path) -> torch.nn.Module:
    from transformers import AutoModel

    return AutoModel.from_pretrained(folder).eval()


def count_calls(blocks) -> list[int]:
    """Wrap ``attend_projected`` of the swapped layers of ``blocks``: the returned list grows
    by one per call."""
    calls: list[int] = []
    for block in blocks:
        layer = block.module.attn
        original = layer.attend_projected

        def counted(*args, original=original):
            calls.append(1)
            return original(*args)

        layer.attend_projected = counted
    return calls


def write_data(folder: Path, image: bool = False) -> str:
    """A small labelled data file in ``folder``: 60 texts of :data:`TEXTS` (label: the text's
    index mod 2) or 40 random 1×8×8 images; returns its name."""
    if image:
        generator = np.random.default_rng(0)
        x = generator.normal(size=(40, 1, 8, 8)).astype(np.float32)
        np.savez(folder / "train.npz", x=x, y=np.arange(40) % 2)
        return "train.npz"
    rows = [f'"{TEXTS[i % len(TEXTS)]}",{i % 2}' for i in range(60)]
    (folder / "train.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    return "train.csv"


def write_spec(folder: Path, backbone: Path, tables: str = "", image: bool = False) -> Path:
    """A model spec in ``folder`` over :func:`write_data`'s file and the backbone folder,
    ``tables`` appended after its ``[model]`` table (no dropout)."""
    kind = "image" if image else "text"
    text = (
        f'[data]\ntrain = "{write_data(folder, image)}"\nkind = "{kind}"\nmax_len = 16\n\n'
        f'[model]\nbackbone = "{backbone}"\ndropout = 0.0\n{tables}'
    )
    path = folder / "model.toml"
    path.write_text(text)
    return path


def fit(tmp_path: Path, model: Path, guide: str, name: str = "run") -> probtrans.Run:
    """One epoch of the project's inference spec ``guide`` (tiny budget) into ``tmp_path/name``."""
    inference = tiny_inference(tmp_path / "inference", guide)
    return probtrans.fit(model, inference, out=tmp_path / name, epochs=1, progress=False)


def elbos(run_dir: Path) -> list[float]:
    return [epoch["elbo"] for epoch in json.loads((run_dir / "history.json").read_text())]


@pytest.fixture(autouse=True)
def _inference_folder(tmp_path):
    (tmp_path / "inference").mkdir()


# ------------------------------------------------------------------ swapped = the pretrained model


@pytest.mark.parametrize("layers", ["all", [-1]], ids=["all_layers", "top_layer"])
@pytest.mark.parametrize("family", FAMILIES)
def test_softmax_swapped_in_gives_the_pretrained_outputs(backbones, family, layers):
    folder = backbones[family]
    reference, swapped = pretrained(folder), pretrained(folder)
    blocks = swap_blocks(swapped, layers, "softmax")
    assert len(blocks) == (2 if layers == "all" else 1)
    calls = count_calls(blocks)
    inputs = model_inputs(family, folder)
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state
        given = swapped(**inputs).last_hidden_state
    assert len(calls) == len(blocks)  # the probtrans layers did the attention
    assert swapped.config._attn_implementation == "probtrans"
    torch.testing.assert_close(given, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("kind", ["h_sto", "sgpa", "gaussian_mixture"])
def test_a_swapped_models_state_dict_loads_into_the_same_swap(backbones, kind):
    """The README's way to keep a swapped model: its ``state_dict`` (pretrained weights and the
    swapped layers' own parameters) loads, every key matched, into a fresh model swapped the
    same way; the unswapped model refuses it, naming the swapped layers' keys."""

    def swapped() -> torch.nn.Module:
        model = pretrained(backbones["bert"])
        probtrans.swap_attention(model, layers=[-1], attention=kind)
        return model

    trained = swapped()
    with torch.no_grad():
        for parameter in trained.parameters():
            parameter.add_(0.01)
    state = trained.state_dict()
    own = [key for key in state if ".attention.self.attn." in key]
    assert own  # the swapped layer's parameters are in it
    fresh = swapped()
    fresh.load_state_dict(state)  # strict: raises on a missing or unexpected key
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, state[key]), key
    with pytest.raises(RuntimeError, match=re.escape(own[0])):
        pretrained(backbones["bert"]).load_state_dict(state)


def test_a_peft_lora_model_is_swapped_through_its_adapters(backbones):
    """A ``peft`` LoRA model (its query, key and value maps adapted, B nonzero as after
    training): its blocks are found through the adapters' base layers, softmax swapped in gives
    the peft model's own outputs (the adapted projections), and SGPA's global keys go through
    the adapted key map."""
    from peft import LoraConfig, get_peft_model

    def peft_model() -> torch.nn.Module:
        torch.manual_seed(0)
        config = LoraConfig(r=4, lora_alpha=8, target_modules=["query", "key", "value"])
        model = get_peft_model(pretrained(backbones["bert"]), config).eval()
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(parameter, std=0.5)
        return model

    reference, swapped = peft_model(), peft_model()
    blocks = swap_blocks(swapped, "all", "softmax")
    assert [b.path for b in blocks] == [
        f"base_model.model.encoder.layer.{i}.attention.self" for i in range(2)
    ]
    assert all(type(b.key_map).__name__ == "Linear" and b.key_map.lora_B for b in blocks)
    inputs = model_inputs("bert", backbones["bert"])
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state
        plain = reference.get_base_model()
        with reference.disable_adapter():
            untouched = plain(**inputs).last_hidden_state
        given = swapped(**inputs).last_hidden_state
    assert (expected - untouched).abs().max() > 1e-2  # the adapters change the outputs
    torch.testing.assert_close(given, expected, rtol=0, atol=1e-5)
    sgpa = peft_model()
    (block,) = swap_blocks(sgpa, [-1], "sgpa")
    with torch.no_grad():
        adapted = block.module.attn.global_keys(block.key_map)
        with sgpa.disable_adapter():
            unadapted = block.module.attn.global_keys(block.key_map)
        assert torch.isfinite(sgpa(**inputs).last_hidden_state).all()
    assert (adapted - unadapted).abs().max() > 1e-3


@pytest.mark.parametrize("kind", ["softmax", "sto", "h_sto", "sgpa", "gaussian_mixture"])
def test_a_layer_swapped_into_a_bfloat16_model_computes_in_float32(backbones, kind):
    """A model loaded in bfloat16 (``dtype=torch.bfloat16``) gets float32 layers: the block's
    queries, keys and values (and SGPA's global keys, through the bfloat16 key map) are cast up
    for them and their output back; softmax swapped in gives the bfloat16 model's own outputs
    to its rounding."""
    from transformers import AutoModel

    folder = backbones["bert"]
    reference = AutoModel.from_pretrained(folder, dtype=torch.bfloat16).eval()
    swapped = AutoModel.from_pretrained(folder, dtype=torch.bfloat16).eval()
    (block,) = swap_blocks(swapped, [-1], kind)
    layer = block.module.attn
    assert all(p.dtype == torch.float32 for p in layer.parameters())
    seen = []
    attend = layer.attend_projected

    def recorded(q, k, v, key_mask, key_map):
        seen.append((q.dtype, key_map(torch.randn(3, q.shape[1] * q.shape[-1])).dtype))
        return attend(q, k, v, key_mask, key_map)

    layer.attend_projected = recorded
    inputs = model_inputs("bert", folder)
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state
        given = swapped(**inputs).last_hidden_state
    assert seen == [(torch.float32, torch.float32)]
    assert given.dtype == torch.bfloat16 and torch.isfinite(given).all()
    if kind == "softmax":
        torch.testing.assert_close(given, expected, rtol=0, atol=0.05)


@pytest.mark.parametrize("family", FAMILIES)
def test_gaussian_mixture_in_the_beta_to_zero_limit_gives_the_pretrained_outputs(backbones, family):
    folder = backbones[family]
    reference, swapped = pretrained(folder), pretrained(folder)
    blocks = swap_blocks(swapped, "all", "gaussian_mixture")  # β → 0, α = 1/√d_head
    calls = count_calls(blocks)
    inputs = model_inputs(family, folder)
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state
        given = swapped(**inputs).last_hidden_state
    assert len(calls) == 2
    torch.testing.assert_close(given, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_backbone_classifier_logits_are_its_head_on_the_pooled_pretrained_output(
    tmp_path, backbones, family
):
    image = family == "vit"
    path = write_spec(tmp_path, backbones[family], "[model.prior]\nweights = 'none'\n", image)
    spec, _ = with_local_backbone(load_model_spec(path))
    data = load_data(spec.data, spec_folder(spec))
    classifier = build_classifier(spec, data).eval()
    assert isinstance(classifier, BackboneClassifier)
    _, inputs, mask, _ = next(data.train.batches(8))
    reference = pretrained(backbones[family])
    with torch.no_grad():
        logits = classifier(inputs, mask)
        if image:
            pooled = reference(pixel_values=inputs).last_hidden_state.mean(1)
        else:
            assert not mask.all()  # a padded batch: mean over the real tokens only
            hidden = reference(input_ids=inputs, attention_mask=mask).last_hidden_state
            weights = mask.unsqueeze(-1).float()
            pooled = (hidden * weights).sum(1) / weights.sum(1)
        expected = classifier.head(pooled)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)


def test_pooler_pooling_is_the_backbones_own_pooler(tmp_path, backbones):
    tables = "pooling = 'pooler'\n[model.prior]\nweights = 'none'\n"
    path = write_spec(tmp_path, backbones["bert"], tables)
    spec, _ = with_local_backbone(load_model_spec(path))
    data = load_data(spec.data, spec_folder(spec))
    classifier = build_classifier(spec, data).eval()
    _, inputs, mask, _ = next(data.train.batches(8))
    reference = pretrained(backbones["bert"])
    with torch.no_grad():
        logits = classifier(inputs, mask)
        expected = classifier.head(reference(input_ids=inputs, attention_mask=mask).pooler_output)
    torch.testing.assert_close(logits, expected, rtol=0, atol=1e-5)


def test_a_backbone_saved_in_float16_trains_in_float32_from_its_weights(tmp_path, backbones):
    """Many checkpoints are saved in float16: the classifier's weights are float32 (its head's
    matrix products would otherwise mix dtypes), equal to the saved ones cast up, and it fits."""
    half = tmp_path / "half"
    pretrained(backbones["bert"]).half().save_pretrained(half)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(backbones["bert"] / name, half / name)
    path = write_spec(tmp_path, half, "[model.prior]\nweights = 'none'\n")
    spec, _ = with_local_backbone(load_model_spec(path))
    classifier = build_classifier(spec, load_data(spec.data, spec_folder(spec))).eval()
    assert {p.dtype for p in classifier.parameters()} == {torch.float32}
    saved = pretrained(half)
    assert {p.dtype for p in saved.parameters()} == {torch.float16}
    for name, weight in saved.state_dict().items():
        assert torch.equal(classifier.backbone.state_dict()[name], weight.float()), name
    run = probtrans.fit(path, tiny_inference(tmp_path, "map"), epochs=1, progress=False)
    assert math.isfinite(run.metrics["nll"])


def test_plain_fine_tuning_is_transformers_sequence_classifier(tmp_path, backbones):
    """The plain-fine-tuning baseline (``pooling = "pooler"``, no priors, every weight trained)
    is ``AutoModelForSequenceClassification``'s network: with the same head its logits and the
    gradients of its loss (per example) are transformers' own."""
    from transformers import AutoModelForSequenceClassification

    tables = "pooling = 'pooler'\n[model.prior]\nweights = 'none'\n"
    path = write_spec(tmp_path, backbones["bert"], tables)
    spec, _ = with_local_backbone(load_model_spec(path))
    data = load_data(spec.data, spec_folder(spec))
    classifier = build_classifier(spec, data).eval()
    reference = AutoModelForSequenceClassification.from_pretrained(
        backbones["bert"], num_labels=data.n_classes
    ).eval()
    with torch.no_grad():
        reference.classifier.weight.copy_(classifier.head.weight)
        reference.classifier.bias.copy_(classifier.head.bias)
    _, inputs, mask, labels = next(data.train.batches(8))
    logits = classifier(inputs, mask)
    expected = reference(input_ids=inputs, attention_mask=mask.long(), labels=labels)
    torch.testing.assert_close(logits, expected.logits, rtol=0, atol=1e-5)
    torch.nn.functional.cross_entropy(logits, labels).backward()
    expected.loss.backward()
    ours = classifier.backbone.encoder.layer[0].attention.self.query.weight.grad
    theirs = reference.bert.encoder.layer[0].attention.self.query.weight.grad
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-7)


def test_pooler_pooling_of_a_backbone_without_a_pooler_is_refused(tmp_path, backbones):
    tables = "pooling = 'pooler'\n[model.prior]\nweights = 'none'\n"
    path = write_spec(tmp_path, backbones["distilbert"], tables)
    with pytest.raises(ConfigError, match="model.pooling = 'pooler'.*has no pooler"):
        fit(tmp_path, path, "map")
    assert not (tmp_path / "run").exists()


def test_sngp_lengthscale_unset_is_the_median_distance_of_the_pretrained_features(
    tmp_path, backbones
):
    from probtrans.gp.kernels import median_distance

    tables = "[model.head]\nkind = 'random_features'\nfeatures = 64\n"
    path = write_spec(tmp_path, backbones["bert"], tables)
    spec, _ = with_local_backbone(load_model_spec(path))
    data = load_data(spec.data, spec_folder(spec))
    torch.manual_seed(0)
    classifier = build_classifier(spec, data)
    torch.manual_seed(0)
    _, inputs, mask, _ = data.train.batch(torch.randperm(len(data.train))[:64])
    with torch.no_grad():
        hidden = pretrained(backbones["bert"])(input_ids=inputs, attention_mask=mask)
    weights = mask.unsqueeze(-1).float()
    features = (hidden.last_hidden_state * weights).sum(1) / weights.sum(1)  # mean pooling
    expected = median_distance(features)
    assert float(classifier.feature_map.lengthscale) == pytest.approx(expected, rel=1e-5)
    assert expected != 1.0
    state = classifier.state_dict()
    assert float(state["feature_map.lengthscale"]) == pytest.approx(expected, rel=1e-5)


def test_sngp_lengthscale_unset_without_two_distinct_training_features_is_refused(
    tmp_path, backbones
):
    """One training text, repeated: the median distance of its features is 0, a length scale
    that would make every logit NaN; the build names the field to set instead."""
    tables = "[model.head]\nkind = 'random_features'\nfeatures = 64\n"
    path = write_spec(tmp_path, backbones["bert"], tables)
    spec, _ = with_local_backbone(load_model_spec(path))
    data = load_data(spec.data, spec_folder(spec))
    first = data.train.inputs[:1].repeat(3, 1), data.train.mask[:1].repeat(3, 1)
    data = dataclasses.replace(data, train=DataSplit(first[0], data.train.labels[:3], first[1]))
    with pytest.raises(ConfigError, match="model.head.lengthscale: unset.*of 3 training examples"):
        build_classifier(spec, data)


def write_package(root: Path, name: str, body: str) -> None:
    (root / f"{name}.py").write_text(body)


@pytest.mark.parametrize(
    "backbone, message",
    [
        ("package:probtrans_no_such_model", "not installed; pip install probtrans-no-such-model"),
        ("package:1bad-name", "give a Python module name after 'package:'"),
        ("package:pt_without_locator", "has no get_model_path"),
        ("package:pt_empty_locator", "is not a model saved by save_pretrained"),
        ("package:pt_failing_locator", r"get_model_path\(\) failed \(no weights here\)"),
    ],
)
def test_a_package_backbone_that_names_no_model_is_one_line_and_writes_nothing(
    tmp_path, monkeypatch, capsys, backbone, message
):
    from probtrans.cli import main

    packages = tmp_path / "packages"
    packages.mkdir()
    write_package(packages, "pt_without_locator", "")
    write_package(
        packages, "pt_empty_locator", f"def get_model_path():\n    return {str(tmp_path)!r}\n"
    )
    write_package(
        packages,
        "pt_failing_locator",
        "def get_model_path():\n    raise OSError('no weights here')\n",
    )
    monkeypatch.syspath_prepend(str(packages))
    path = write_spec(tmp_path, Path("unused"), "")
    path.write_text(path.read_text().replace('"unused"', repr(backbone).replace("'", '"')))
    assert main(["fit", str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ")
    assert re.search(message, err[0]) and "model.backbone" in err[0]
    assert not (tmp_path / "run").exists()


def test_a_backbone_folder_without_its_tokenizer_is_one_line_and_writes_nothing(
    tmp_path, backbones, capsys
):
    """A model saved without its tokenizer (``model.save_pretrained`` alone): ``transformers``
    builds a tokenizer of special tokens alone from its config, which reads every word as
    unknown; refused, naming the field, instead of a fit on unknown tokens. The same folder
    with a tokenizer named by ``data.tokenizer`` reads the texts."""
    from probtrans.cli import main

    folder = tmp_path / "model_only"
    shutil.copytree(backbones["bert"], folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).unlink()
    path = write_spec(tmp_path, folder)
    assert main(["fit", str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "model.backbone" in err[0]
    assert "no vocabulary beyond its 5 special tokens" in err[0]
    assert not (tmp_path / "run").exists()
    named = path.read_text().replace(
        "max_len = 16", f'max_len = 16\ntokenizer = "{backbones["bert"]}"'
    )
    path.write_text(named)
    spec = load_model_spec(path)
    data = load_data(spec.data, spec_folder(spec))
    assert (data.train.inputs[data.train.mask] > 4).float().mean() > 0.5  # words, not [UNK] (id 1)


def test_images_of_other_channels_than_the_backbones_are_refused_with_both_shapes(
    tmp_path, backbones
):
    path = write_spec(tmp_path, backbones["vit"], image=True)
    x = np.random.default_rng(0).normal(size=(40, 3, 8, 8)).astype(np.float32)  # RGB
    np.savez(tmp_path / "train.npz", x=x, y=np.arange(40) % 2)
    spec, _ = with_local_backbone(load_model_spec(path))
    with pytest.raises(ConfigError) as refused:
        build_classifier(spec, load_data(spec.data, spec_folder(spec)))
    assert str(refused.value).endswith(
        f"data: images of shape (3, 8, 8): model.backbone = {str(backbones['vit'])!r} takes "
        f"images of 1 channel, (N, 1, H, W)"
    )


def test_a_peft_adapter_folder_as_backbone_names_its_base_model(tmp_path, backbones, capsys):
    from peft import LoraConfig, get_peft_model

    from probtrans.cli import main

    model = get_peft_model(pretrained(backbones["bert"]), LoraConfig(r=2, target_modules=["query"]))
    model.save_pretrained(tmp_path / "adapter")  # adapter_config.json and its weights alone
    path = write_spec(tmp_path, tmp_path / "adapter")
    capsys.readouterr()  # transformers' loading bars
    assert main(["fit", str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "model.backbone" in err[0]
    assert f"(it holds a PEFT adapter of {str(backbones['bert'])!r}: give its base model" in err[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "backbone, hint",
    [
        ("bert-base-uncased", "(a hub model is named hf:bert-base-uncased)"),
        ("sentence-transformers/all-MiniLM-L6-v2", "named hf:sentence-transformers/all-MiniLM"),
        ("models/../nowhere", None),  # a path: no hub hint
    ],
)
def test_a_backbone_written_as_a_bare_hub_id_is_told_its_hf_prefix(tmp_path, backbone, hint):
    from probtrans.hub import backbone_folder

    with pytest.raises(ConfigError, match="no such folder") as raised:
        backbone_folder(backbone, tmp_path)
    message = str(raised.value)
    assert (hint in message) if hint else "hf:" + backbone not in message


# ------------------------------------------------------------------ stochastic attention


def sto_classifier(tmp_path: Path, folder: Path, sharpen: float) -> tuple[BackboneClassifier, dict]:
    """A classifier whose top block is STO-TRANS attention, hard, τ → 0, its pretrained query
    map multiplied by ``sharpen``; and the dict its layer fills with q, k and the key mask."""
    tables = "[model.swap]\nlayers = [-1]\nattention = { kind = 'sto', hard = true, tau = 1e-6 }\n"
    spec, _ = with_local_backbone(load_model_spec(write_spec(tmp_path, folder, tables)))
    classifier = build_classifier(spec, load_data(spec.data, spec_folder(spec))).eval()
    block = classifier.backbone.encoder.layer[1].attention.self
    with torch.no_grad():
        block.query.weight.mul_(sharpen)
        block.query.bias.mul_(sharpen)
    seen: dict = {}
    original = block.attn.attend_projected

    def keep(q, k, v, key_mask, key_map):
        seen.update(q=q, k=k, key_mask=key_mask)
        return original(q, k, v, key_mask, key_map)

    block.attn.attend_projected = keep
    return classifier, seen


def sampled_attention(classifier: BackboneClassifier, seen: dict, ids, mask):
    """The traced one-hot â_v (B, H, L, L) of the top block and its logits q kᵀ (padding keys
    −∞)."""
    with torch.no_grad():
        trace = poutine.trace(classifier).get_trace(ids, mask)
    a_v = trace.nodes[f"{TOP}.attn.a_v"]["value"]
    logits = seen["q"] @ seen["k"].transpose(-1, -2)
    return a_v, logits.masked_fill(~seen["key_mask"][:, None, None, :], -math.inf)


def text_batch(folder: Path, repeats: int = 5):
    from transformers import AutoTokenizer

    batch = AutoTokenizer.from_pretrained(folder)(
        TEXTS * repeats, padding=True, return_tensors="pt"
    )
    return batch["input_ids"], batch["attention_mask"].bool()


def test_hard_sto_at_zero_temperature_picks_the_argmax_of_peaked_pretrained_logits(
    tmp_path, backbones
):
    """At τ → 0 a hard sample is one-hot on argmax(q kᵀ + Gumbel noise): the argmax of the
    pretrained logits wherever they are peaked. The tiny random model's logits are nearly
    flat (some rows' top two differ by 1e-5), so its query map is scaled up by 1e5, until the
    expected share of rows whose draw is not the argmax, mean(1 − max softmax(q kᵀ)), is
    below 0.3 %."""
    classifier, seen = sto_classifier(tmp_path, backbones["bert"], sharpen=1e5)
    ids, mask = text_batch(backbones["bert"])
    a_v, logits = sampled_attention(classifier, seen, ids, mask)
    rows = mask[:, None, :].expand(a_v.shape[:-1])  # the rows of real query tokens
    assert a_v.shape == logits.shape == (len(ids), 4, ids.shape[1], ids.shape[1])
    assert set(a_v.unique().tolist()) == {0.0, 1.0}  # one-hot rows
    assert torch.equal(a_v.sum(-1), torch.ones_like(a_v.sum(-1)))
    assert not a_v[~mask[:, None, None, :].expand_as(a_v)].any()  # never a padding key
    peaked = 1 - logits.softmax(-1).amax(-1)[rows].mean()
    assert peaked < 0.003  # the expected share of non-argmax picks
    agree = (a_v.argmax(-1) == logits.argmax(-1))[rows].float().mean()
    assert agree >= 0.99


def test_hard_sto_at_zero_temperature_samples_the_softmax_of_the_pretrained_logits(
    tmp_path, backbones
):
    """With logits of order 1, the one-hot draws are the categorical softmax(q kᵀ) (the
    Gumbel-max trick), not its argmax: their mean over draws is softmax(q kᵀ)."""
    classifier, seen = sto_classifier(tmp_path, backbones["bert"], sharpen=40.0)
    ids, mask = text_batch(backbones["bert"], repeats=1)
    draws, logits = [], None
    for seed in range(300):
        torch.manual_seed(seed)
        a_v, logits = sampled_attention(classifier, seen, ids, mask)
        draws.append(a_v)
    frequencies = torch.stack(draws).mean(0)
    probs = logits.softmax(-1)
    rows = mask[:, None, :].expand(probs.shape[:-1])
    assert 0.2 < (1 - probs.amax(-1)[rows]).mean() < 0.8  # neither peaked nor uniform
    assert (frequencies - probs)[rows].abs().max() < 0.12  # 300 draws: σ ≤ 0.03
    assert (frequencies - probs)[rows].abs().mean() < 0.02


# ------------------------------------------------------------------ SGPA in a backbone


def test_sgpa_in_the_top_block_trains_and_describe_names_its_sites(tmp_path, backbones):
    tables = "[model.swap]\nlayers = [-1]\nattention = { kind = 'sgpa', n_inducing = 4 }\n"
    path = write_spec(tmp_path, backbones["bert"], tables)
    run = fit(tmp_path, path, "sgpa")
    history = elbos(run.path)
    assert len(history) == 1 and np.isfinite(history).all()
    rows = {row["site"]: row for row in site_table(load_model_spec(path))}
    assert rows[f"{TOP}.attn.u_g"]["role"] == "global"
    assert rows[f"{TOP}.attn.u_g"]["event_shape"] == str((4, 8, 4))  # heads, d_head, M_g
    assert rows[f"{TOP}.attn.f"]["role"] == "local (per example)"
    assert not any(".layer.0." in site for site in rows)  # only the top block is swapped


def test_standard_sgpa_is_refused_in_a_backbone(tmp_path, backbones):
    tables = "[model.swap]\nattention = { kind = 'sgpa_standard' }\n"
    path = write_spec(tmp_path, backbones["bert"], tables)
    with pytest.raises(ConfigError, match="cannot be placed in a backbone") as refused:
        fit(tmp_path, path, "map")
    assert "model.swap.attention.kind = 'sgpa_standard'" in str(refused.value)


# ------------------------------------------------------------------ LoRA

LORA = """
[model.swap]
layers = [-1]
attention = { kind = "h_sto" }

[model.prior]
weights = "lora"
lora = { r = 2, alpha = 4, targets = ["query", "value"] }
"""


def test_describe_lists_the_adapter_sites_and_the_head(tmp_path, backbones):
    rows = {
        row["site"]: row
        for row in site_table(load_model_spec(write_spec(tmp_path, backbones["bert"], LORA)))
    }
    for layer in (0, 1):
        for target in ("query", "value"):
            site = f"backbone.encoder.layer.{layer}.attention.self.{target}.lora_a"
            assert rows[site]["role"] == "global", site
            assert site.replace("lora_a", "lora_b") not in rows  # BLoB: B a point estimate
        assert f"backbone.encoder.layer.{layer}.attention.self.key.lora_a" not in rows
    assert rows[f"{TOP}.query.lora_a"]["event_shape"] == str((2, 32))  # (r, d_in)
    assert rows["head.weight"]["role"] == rows["head.bias"]["role"] == "global"
    assert rows[f"{TOP}.attn.a_v"]["role"] == "local (per example)"

    both = LORA.replace("targets", 'random = "ab", targets')
    rows = {
        row["site"]: row
        for row in site_table(load_model_spec(write_spec(tmp_path, backbones["bert"], both)))
    }
    assert rows[f"{TOP}.query.lora_a"]["role"] == rows[f"{TOP}.value.lora_b"]["role"] == "global"
    assert rows[f"{TOP}.value.lora_b"]["event_shape"] == str((32, 2))  # (d_out, r)


FROZEN = "the backbone is frozen: model.train_backbone = true fine-tunes its weights at this rate"


@pytest.mark.parametrize(
    "tables, why",
    [
        (LORA, FROZEN),
        (None, "the model has no pretrained backbone"),
        (f"train_backbone = true\n{LORA}", None),
    ],
    ids=["lora_frozen", "no_backbone", "lora_trained"],
)
def test_a_backbone_lr_that_applies_to_no_weight_is_noted(tmp_path, backbones, capsys, tables, why):
    """``optim.backbone_lr`` on a frozen backbone (Bayesian LoRA's default), or on a network
    trained here (``tables`` None: no backbone), sets the rate of no parameter: fit says so and
    why; where the backbone trains, nothing is said."""
    path = write_spec(tmp_path, backbones["bert"], tables or "")
    if tables is None:
        path.write_text(path.read_text().split("[model]")[0])
    inference = tiny_inference(tmp_path / "inference", "map")
    text = inference.read_text().replace("[optim]\n", "[optim]\nbackbone_lr = 5e-5\n")
    inference.write_text(text)
    probtrans.fit(path, inference, out=tmp_path / "run", epochs=1, progress=False)
    notes = [line for line in capsys.readouterr().err.splitlines() if "backbone_lr" in line]
    expected = f"note: optim.backbone_lr = 5e-05 applies to no weight here ({why})"
    assert notes == ([expected] if why else [])


@pytest.mark.parametrize("family", TEXT_FAMILIES)
def test_all_linear_adapts_every_linear_map_of_any_family(backbones, family):
    from probtrans.backbone.lora import LoRALinear, add_lora

    model = pretrained(backbones[family])
    linear = [p for p, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    adapters = add_lora(model, ["all-linear"], r=2, alpha=4)
    assert sorted(adapters) == sorted(linear) and len(linear) >= 6
    assert all(isinstance(model.get_submodule(path), LoRALinear) for path in linear)


#: family of the tests → (the family's name, its query and value maps (ModernBERT's stacked
#: map), its heads' attribute)
EXPECTED_FAMILIES = {
    "bert": ("BERT", ["query", "value"], "num_attention_heads"),
    "roberta": ("RoBERTa", ["query", "value"], "num_attention_heads"),
    "distilbert": ("DistilBERT", ["q_lin", "v_lin"], "n_heads"),
    "modernbert": ("ModernBERT", ["Wqkv"], "num_attention_heads"),
    "vit": ("ViT", ["q_proj", "v_proj"], "num_attention_heads"),
}


@pytest.mark.parametrize("family", FAMILIES)
def test_each_family_is_one_entry_of_the_table_with_its_facts(backbones, family):
    """The family table (:mod:`probtrans.backbone.families`) names each tiny model's family, its
    heads, its positions (RoBERTa's start after the padding id) and the maps LoRA adapts when
    ``lora.targets`` is unset, which are the model's own query and value maps; a model type the
    table does not list is still known by its modules."""
    from probtrans.backbone.families import attention_heads, family_of, lora_targets, max_positions
    from probtrans.backbone.lora import add_lora

    name, targets, heads = EXPECTED_FAMILIES[family]
    model = pretrained(backbones[family])
    assert family_of(model).name == name
    assert attention_heads(model.config) == getattr(model.config, heads) == 4
    assert lora_targets(model) == targets
    adapted = sorted({path.rsplit(".", 1)[-1] for path in add_lora(model, targets, 2, 4.0)})
    assert adapted == sorted(targets)
    offset = model.config.pad_token_id + 1 if family == "roberta" else 0
    expected = getattr(model.config, "max_position_embeddings", 2**31 + offset) - offset
    assert max_positions(model.config) == expected
    model.config.model_type = "unlisted"  # known by its projections alone
    assert lora_targets(model) == targets
    assert family_of(model).projections[::2] == tuple(targets)


def test_a_fit_and_a_reload_resolve_the_backbone_once_and_read_its_config_once(
    tmp_path, backbones, monkeypatch
):
    """``model.backbone`` is turned into a folder and its config read once per fit (the
    resolved value carried to the data, the model and the run folder), and once per
    ``Run.load`` (the config the run keeps)."""
    import probtrans.hub as hub

    calls = {"backbone_folder": 0, "load_config": 0}

    def counted(function):
        def wrapper(*args, **kwargs):
            calls[function.__name__] += 1
            return function(*args, **kwargs)

        return wrapper

    for name in calls:
        monkeypatch.setattr(hub, name, counted(getattr(hub, name)))
    run = fit(tmp_path, write_spec(tmp_path, backbones["bert"]), "map")
    assert calls == {"backbone_folder": 1, "load_config": 1}
    probtrans.Run.load(run.path)
    assert calls == {"backbone_folder": 1, "load_config": 2}


def test_a_backbone_of_no_known_family_with_lora_targets_unset_is_refused():
    from probtrans.backbone.families import lora_targets

    with pytest.raises(ConfigError, match="model.prior.lora.targets: unset, and Linear is of no"):
        lora_targets(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("kind", ["h_sto", "sgpa"])
def test_a_fitted_run_takes_the_backbone_defaults_of_the_options_its_spec_left_unset(
    tmp_path, backbones, kind
):
    """The scales the spec does not set follow the backbone's heads (4 heads of 8 dimensions
    here) in the network that fit trains and in the one a reloaded run rebuilds, as they do in
    swap_blocks (the tokenizer that fit resolves once made every option look set)."""
    tables = f'[model.swap]\nlayers = [-1]\nattention = {{ kind = "{kind}", n_inducing = 4 }}\n'
    if kind == "h_sto":
        tables = '[model.swap]\nlayers = [-1]\nattention = { kind = "h_sto", tau2 = 3.0 }\n'
    run = fit(tmp_path, write_spec(tmp_path, backbones["bert"], tables), "map")
    for classifier in (run.classifier, probtrans.Run.load(run.path).classifier):
        layer = classifier.backbone.get_submodule("encoder.layer.1.attention.self.attn")
        if kind == "h_sto":
            assert (layer.tau1, layer.tau2) == (pytest.approx(8**0.5), 3.0)
        else:
            assert layer.prior_mean == "softmax" and layer.options.outputscale == 1.0
            assert layer.options.lengthscale == "keys"  # measured on the pretrained keys
            assert isinstance(layer.inducing_map, torch.nn.Identity)


def test_the_report_of_a_swapped_backbone_run_names_backbone_blocks_kind_and_file(
    tmp_path, backbones, monkeypatch
):
    from probtrans.analysis import figures

    titles = []
    drawn = figures.save_run_figure
    monkeypatch.setattr(
        figures, "save_run_figure", lambda *a, **k: titles.append(k["title"]) or drawn(*a, **k)
    )
    tables = '[model.swap]\nlayers = [-1]\nattention = { kind = "h_sto" }\n'
    fit(tmp_path, write_spec(tmp_path, backbones["bert"], tables), "map")
    (title,) = titles
    assert title.startswith("train.csv · bert with h_sto attention in blocks -1 · guide: ")


def test_a_run_rebuilt_under_other_attention_defaults_is_refused_with_the_value_to_write(
    tmp_path, backbones, monkeypatch
):
    """The checkpoint keeps each attention layer's resolved options: when an unset option's
    default changes after a fit, loading names the option and the trained value."""
    from probtrans.specs.attention import HierarchicalOptions

    tables = '[model.swap]\nlayers = [-1]\nattention = { kind = "h_sto" }\n'
    run = fit(tmp_path, write_spec(tmp_path, backbones["bert"], tables), "map")
    assert probtrans.Run.load(run.path).classifier is not None  # the same defaults: loads
    monkeypatch.setattr(HierarchicalOptions, "backbone_defaults", staticmethod(lambda d: {}))
    with pytest.raises(ProbtransError) as refused:
        probtrans.Run.load(run.path)
    message = str(refused.value)
    assert "encoder.layer.1.attention.self.attn was trained with tau1 = 2.828" in message
    assert "now builds tau1 = 1.0" in message and "refit it, with tau1 = 2.828" in message


def test_a_checkpoint_from_before_an_option_existed_is_read_with_that_options_default(
    tmp_path, backbones
):
    """An option a checkpoint does not name was added since its fit: the network was built with
    that option's default (SGPA's G, a LayerNorm, before ``inducing_map``), and a backbone
    default of another value is refused with the value to write."""
    from probtrans.runs.run import check_attention_options

    tables = '[model.swap]\nlayers = [-1]\nattention = { kind = "sgpa", n_inducing = 4 }\n'
    run = fit(tmp_path, write_spec(tmp_path, backbones["bert"], tables), "map")
    options = run.classifier.attention_options()
    check_attention_options(run.path, {"attention_options": json.dumps(options)}, run.classifier)
    older = {layer: dict(kept) for layer, kept in options.items()}
    for kept in older.values():
        del kept["inducing_map"]
    with pytest.raises(ProbtransError) as refused:
        check_attention_options(run.path, {"attention_options": json.dumps(older)}, run.classifier)
    message = str(refused.value)
    assert "was trained with inducing_map = 'layernorm'" in message
    assert "now builds inducing_map = 'identity'" in message


def test_sgpa_over_bayesian_lora_trains_under_the_mean_field_elbo_without_warnings(
    tmp_path, backbones
):
    """The model draws its global sites in the guide's order (inducing variables first), so
    TraceMeanField_ELBO's check passes instead of warning with every site name."""
    tables = (
        '[model.swap]\nlayers = [-1]\nattention = { kind = "sgpa", n_inducing = 4 }\n\n'
        '[model.prior]\nweights = "lora"\nlora = { r = 2, alpha = 4 }\n'
    )
    model = write_spec(tmp_path, backbones["bert"], tables)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run = fit(tmp_path, model, "mfvi")
    assert run.inference_spec.elbo.name == "meanfield"
    assert not [w for w in caught if "mean field restriction" in str(w.message)]


def test_a_misspelt_lora_target_lists_the_backbones_own_map_names(backbones):
    """The names offered are the backbone's (query among them), not the adapters' inner ones."""
    from probtrans.backbone.lora import add_lora

    with pytest.raises(ConfigError, match="'valeu' matches no linear map") as raised:
        add_lora(pretrained(backbones["bert"]), ["query", "valeu"], r=2, alpha=4)
    offered = str(raised.value).rpartition("named ")[2].rstrip(")").split(", ")
    assert "query" in offered and "value" in offered and "base" not in offered


@pytest.mark.parametrize("guide", ["map", "mfvi", "lowrank"])
def test_lora_guides_train_and_leave_the_pretrained_weights_unchanged(tmp_path, backbones, guide):
    folder = backbones["bert"]
    run = fit(tmp_path, write_spec(tmp_path, folder, LORA), guide)
    history = elbos(run.path)
    assert len(history) == 1 and np.isfinite(history).all()
    saved = torch.load(run.path / "checkpoint.pt", weights_only=True)["model_state"]
    assert saved[f"{TOP}.value.lora_b"].abs().max() > 0  # B starts at 0: the adapters moved
    assert f"{TOP}.value.lora_a" in run.posterior_samples(1)
    checked = set()
    for key, value in pretrained(folder).state_dict().items():
        module, _, name = key.rpartition(".")
        if module.rpartition(".")[2] in ("query", "value"):  # LoRALinear keeps it as .base
            module += ".base"
        mapped = f"backbone.{module}.{name}"
        assert torch.equal(saved[mapped], value), mapped
        checked.add(mapped)
    frozen = {
        k
        for k in saved
        if k.startswith("backbone.") and ".attn." not in k and not k.endswith(".lora_b")
    }
    assert frozen == checked  # every backbone weight but the swapped layer's and adapters' own
    assert f"{TOP}.attn.centroids" in saved


def test_train_backbone_fine_tunes_every_weight_under_bayesian_adapters(tmp_path, backbones):
    """``train_backbone = true`` with LoRA priors: the backbone's own weights train at
    ``backbone_lr`` (a group of their own), the swapped layer and the adapters' guide at
    ``lr``."""
    from probtrans.inference.train import SVITraining
    from probtrans.resolve import load_inference_spec

    path = write_spec(
        tmp_path,
        backbones["bert"],
        LORA.replace("[model.swap]", "train_backbone = true\n[model.swap]"),
    )
    spec, _ = with_local_backbone(load_model_spec(path))
    data = load_data(spec.data, spec_folder(spec))
    classifier = build_classifier(spec, data)
    pretrained = classifier.pretrained_parameters()
    names = {id(p): n for n, p in classifier.named_parameters()}
    pretrained_names = {names[id(p)] for p in pretrained}
    assert "backbone.encoder.layer.0.attention.self.query.base.weight" in pretrained_names
    assert "backbone.embeddings.word_embeddings.weight" in pretrained_names
    assert not any(".attn." in name for name in pretrained_names)  # the swapped layer is new
    adapters_b = {n for n in names.values() if n.endswith(".lora_b")}
    assert len(adapters_b) == 4 and not adapters_b & pretrained_names  # B is new: at lr
    inference = load_inference_spec(tiny_inference(tmp_path / "inference", "mfvi"))
    inference = inference.model_copy(
        update={"optim": inference.optim.model_copy(update={"backbone_lr": 1e-4})}
    )
    training = SVITraining(classifier, data, inference, seed=0, device="cpu")
    rates = [group["lr"] for group in training.optimizer.param_groups]
    assert rates == [inference.optim.lr, 1e-4]
    assert {id(p) for p in training.optimizer.param_groups[1]["params"]} == {
        id(p) for p in pretrained
    }
    before = classifier.backbone.embeddings.word_embeddings.weight.detach().clone()
    training.epoch(1, progress=False)
    assert not torch.equal(before, classifier.backbone.embeddings.word_embeddings.weight)


def test_scale_lr_steps_the_guides_scales_faster_than_lr_can(tmp_path, backbones):
    """``[optim] scale_lr``: the mean-field scales of the adapters and head are a group of
    their own; in 2 epochs they move further than Adam at ``lr`` can move anything (about
    ``lr`` per step, at most ``lr`` · (1 − β1) / √(1 − β2) ≈ 3.2 ``lr``), the locations do not."""
    from probtrans.inference.guide_builder import spread_parameters
    from probtrans.inference.train import SVITraining
    from probtrans.resolve import load_inference_spec

    spec, _ = with_local_backbone(load_model_spec(write_spec(tmp_path, backbones["bert"], LORA)))
    data = load_data(spec.data, spec_folder(spec))
    classifier = build_classifier(spec, data)
    inference = load_inference_spec(tiny_inference(tmp_path / "inference", "mfvi"))
    lr, scale_lr = 1e-4, 0.05
    optim = inference.optim.model_copy(update={"lr": lr, "scale_lr": scale_lr})
    inference = inference.model_copy(update={"optim": optim})
    training = SVITraining(classifier, data, inference, seed=0, device="cpu")
    assert [group["lr"] for group in training.optimizer.param_groups] == [lr, scale_lr]
    scales = spread_parameters(training.guide)
    assert {id(p) for p in training.optimizer.param_groups[1]["params"]} == {id(p) for p in scales}
    locs = list(training.guide.locs.parameters())
    before = [p.detach().clone() for p in [*scales, *locs]]
    for epoch in range(2):
        training.epoch(epoch, progress=False)
    steps = 2 * training.steps_per_epoch
    moved = [
        (p.detach() - b).abs().max().item() for p, b in zip([*scales, *locs], before, strict=True)
    ]
    assert max(moved[: len(scales)]) > 4 * lr * steps
    assert max(moved[len(scales) :]) < 4 * lr * steps


def test_lora_alone_keeps_the_pretrained_weights_frozen(tmp_path, backbones):
    path = write_spec(tmp_path, backbones["bert"], LORA)
    spec, _ = with_local_backbone(load_model_spec(path))
    classifier = build_classifier(spec, load_data(spec.data, spec_folder(spec)))
    assert classifier.pretrained_parameters() == []


def test_a_guide_of_your_own_trains_over_the_adapters_and_the_head(tmp_path, backbones):
    """``probtrans.fit(..., guide=AutoLowRankMultivariateNormal)``: Pyro's own autoguide over
    the adapter and head sites of a LoRA backbone; its posterior draws differ."""
    from pyro.infer.autoguide import AutoLowRankMultivariateNormal

    model = write_spec(tmp_path, backbones["bert"], LORA)
    inference = tiny_inference(tmp_path / "inference", "map")
    run = probtrans.fit(
        model,
        inference,
        out=tmp_path / "own",
        epochs=1,
        progress=False,
        guide=AutoLowRankMultivariateNormal,
    )
    assert np.isfinite(elbos(run.path)).all()
    draws = run.posterior_samples(2)
    assert {f"{TOP}.query.lora_a", "head.weight"} <= set(draws)
    assert not torch.equal(draws["head.weight"][0], draws["head.weight"][1])


# ------------------------------------------------------------------ run folders


def test_a_copied_run_folder_predicts_offline_without_the_backbone_folder(tmp_path, monkeypatch):
    folder = save_tiny_backbone("bert", tmp_path / "bert")
    run = fit(tmp_path, write_spec(tmp_path, folder, LORA), "mfvi")
    texts = ["a wonderful film", "the worst plot", "bad acting and a dull ending"]
    expected = probtrans.Run.load(run.path).predict(texts, samples=3, seed=1)

    folder.rename(tmp_path / "moved_away")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "empty_hf_home"))
    copy = shutil.copytree(run.path, tmp_path / "elsewhere" / "run")
    shutil.rmtree(run.path)
    given = probtrans.Run.load(copy).predict(texts, samples=3, seed=1)
    assert (copy / "backbone" / "config.json").is_file()
    assert given.keys() == expected.keys()
    for column, values in expected.items():
        if values.dtype.kind == "f":
            np.testing.assert_allclose(given[column], values, rtol=0, atol=1e-6)
        else:
            np.testing.assert_array_equal(given[column], values)
    assert not np.allclose(given["p_0"], given["p_0"][0])  # the texts get different answers


# ------------------------------------------------------------------ the backbone's tokenizer


def test_a_run_without_its_saved_data_reads_the_texts_by_the_backbones_tokenizer(
    tmp_path, monkeypatch
):
    """A run folder without ``data.json`` (written before runs kept their data, or holding
    another run's) reads its model spec's ``[data]`` again: by the backbone's tokenizer, as
    ``fit`` did, not by a word-level tokenizer trained on the texts, whose ids the pretrained
    embedding would read as other words."""
    folder = save_tiny_backbone("bert", tmp_path / "bert")
    run = fit(tmp_path, write_spec(tmp_path, folder, "[model.prior]\nweights = 'none'\n"), "map")
    kept = probtrans.Run.load(run.path)
    monkeypatch.chdir(tmp_path)  # the spec's relative data path starts here
    for name in ("data.json", "data.pt", "tokenizer.json"):
        (run.path / name).unlink()
    again = probtrans.Run.load(run.path)
    for split in ("train", "test"):
        assert torch.equal(getattr(again.data, split).inputs, getattr(kept.data, split).inputs)
    texts = ["a wonderful film", "the worst plot", "bad acting and a dull ending"]
    expected, given = kept.predict(texts)["p_0"], again.predict(texts)["p_0"]
    np.testing.assert_allclose(given, expected, rtol=0, atol=1e-6)


def test_runs_keep_the_backbone_tokenizer_and_roberta_padding_masks(tmp_path, backbones):
    from transformers import AutoTokenizer

    folder = backbones["roberta"]
    reference = AutoTokenizer.from_pretrained(folder)
    assert reference.pad_token_id == 1
    run = fit(tmp_path, write_spec(tmp_path, folder, "[model.prior]\nweights = 'none'\n"), "map")
    info = json.loads((run.path / "data.json").read_text())
    assert info["vocab_size"] == len(reference)
    kept = Tokenizer.from_file(str(run.path / "tokenizer.json"))
    assert kept.get_vocab_size() == len(reference)
    for text in TEXTS:
        assert kept.encode(text).ids == reference(text)["input_ids"]

    ids, mask = run.data.train.inputs, run.data.train.mask
    lengths = torch.tensor([len(reference(t)["input_ids"]) for t in TEXTS])
    assert lengths.min() < ids.shape[1]  # some rows are padded
    padding = torch.arange(ids.shape[1]) >= mask.sum(1, keepdim=True)
    assert torch.equal(mask, ~padding)  # real tokens first, then padding only
    assert (ids[padding] == 1).all() and (ids[mask] != 1).all()
    assert (ids[:, 0] == reference.cls_token_id).all() and mask[:, 0].all()  # <s> is id 0
    new_ids, new_mask = probtrans.Run.load(run.path).data.encode(["bad", TEXTS[0]])
    short = len(reference("bad")["input_ids"])  # <s> bad </s>, then padding
    assert new_ids.shape[1] == len(reference(TEXTS[0])["input_ids"]) > short
    assert torch.equal(new_mask[0], torch.arange(new_ids.shape[1]) < short)
    assert new_mask[1].all() and (new_ids[0, short:] == 1).all()


# ------------------------------------------------------------------ your own Pyro model


def test_swap_attention_gives_a_pyro_module_for_your_own_model(backbones):
    folder = backbones["bert"]
    hf_model = pretrained(folder)

    class Mine(PyroModule):
        def __init__(self) -> None:
            super().__init__()
            self.enc = probtrans.swap_attention(hf_model, layers=[-1], attention="h_sto")

        def forward(self, **inputs):
            return self.enc(**inputs).last_hidden_state

    mine = Mine()
    assert isinstance(mine.enc, PyroModule)
    inputs = model_inputs("bert", folder)
    trace = poutine.trace(mine).get_trace(**inputs)
    sites = [name for name, site in trace.nodes.items() if site["type"] == "sample"]
    assert "enc.model.encoder.layer.1.attention.self.attn.a_v" in sites
    assert "enc.model.encoder.layer.1.attention.self.attn.a_c" in sites
    assert not any(".layer.0." in site for site in sites)
    owned = {id(p) for p in mine.parameters()}
    assert all(id(p) in owned for p in hf_model.parameters())
    assert [b.path for b in attention_blocks(hf_model) if "attn" in b.module._modules] == [
        "encoder.layer.1.attention.self"
    ]
    out = trace.nodes["_RETURN"]["value"]
    out.sum().backward()  # gradients reach the pretrained weights through the swapped block
    assert hf_model.encoder.layer[1].attention.self.query.weight.grad.abs().sum() > 0


# ------------------------------------------------------------------ post-hoc stochastic attention


def test_posthoc_stochastic_attention_samples_inside_and_leaves_the_model_as_it_was(
    tmp_path, backbones
):
    """Inside ``sampled_attention`` the top block of an unswapped backbone samples its weights
    (an STO site of one-hot-like rows); afterwards the model, its attention setting and its
    outputs are exactly as before."""
    spec, _ = with_local_backbone(load_model_spec(write_spec(tmp_path, backbones["bert"])))
    data = load_data(spec.data, spec_folder(spec))
    classifier = build_classifier(spec, data).eval()
    block = classifier.backbone.encoder.layer[1].attention.self
    _, ids, mask, _ = next(data.train.batches(6))
    with torch.no_grad():
        before = classifier(ids, mask)
        with classifier.sampled_attention([-1], tau=1.0):
            assert classifier.backbone.config._attn_implementation == "probtrans"
            draws = [poutine.trace(classifier).get_trace(ids, mask) for _ in range(2)]
        after = classifier(ids, mask)
    a_v = [trace.nodes[f"{TOP}.attn.a_v"]["value"] for trace in draws]
    assert a_v[0].shape == (6, 4, ids.shape[1], ids.shape[1])
    assert not torch.equal(a_v[0], a_v[1])  # sampled
    torch.testing.assert_close(a_v[0].sum(-1), torch.ones(a_v[0].shape[:-1]))
    sampled = [site for site in draws[0].nodes if site.endswith(".a_v")]
    assert sampled == [f"{TOP}.attn.a_v"]  # the top block only
    assert "attn" not in block._modules
    assert classifier.backbone.config._attn_implementation == "sdpa"
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_posthoc_stochastic_attention_is_a_variant_of_a_backbone_run(tmp_path, backbones, capfd):
    """``posthoc = ["stochastic_attention"]`` picks τ on the validation NLL (said on stderr)
    and writes its metrics beside the plain ones; a model trained here is refused before any
    training."""
    inference = tiny_inference(tmp_path / "inference", "map")
    options = "[predictive]\nposthoc = ['stochastic_attention']\nstochastic_taus = [0.5, 2.0]"
    text = inference.read_text().replace("[predictive]", options)
    inference.write_text(text)
    model = write_spec(tmp_path, backbones["bert"])
    run = probtrans.fit(model, inference, out=tmp_path / "run", epochs=1, progress=False)
    assert "stochastic_attention: tau = " in capfd.readouterr().err
    metrics = run.metrics
    for key in ("stochastic_attention.nll", "stochastic_attention.ece", "nll"):
        assert math.isfinite(metrics[key]), key
    from tests.conftest import TINY_MODEL

    (tmp_path / "tiny.toml").write_text(TINY_MODEL)
    with pytest.raises(ConfigError, match="stochastic_attention': needs a model.backbone"):
        probtrans.fit(tmp_path / "tiny.toml", inference, out=tmp_path / "no", progress=False)
    assert not (tmp_path / "no").exists() and not (tmp_path / "no.partial").exists()
    inference.write_text(text.replace("[predictive]", "[predictive]\nstochastic_layers = [5]"))
    with pytest.raises(ConfigError, match=r"stochastic_layers = \[5\]: index 5 is out of range"):
        probtrans.fit(model, inference, out=tmp_path / "no", progress=False)  # before training
    assert not (tmp_path / "no").exists() and not (tmp_path / "no.partial").exists()


# ------------------------------------------------------------------ replicas share the lower blocks


def rows_seen(module: torch.nn.Module) -> list[int]:
    """The returned list grows by the rows of each call of ``module``."""
    rows: list[int] = []
    module.register_forward_pre_hook(lambda _, args: rows.append(len(args[0])))
    return rows


def replicated_predictive(classifier, split, mc_dropout: bool = False) -> np.ndarray:
    """Class probabilities of 4 replicas of the local randomness, 16 rows a batch, seed 0."""
    pyro.set_rng_seed(0)
    return sample_predictive(classifier, None, split, 4, 64, draws={}, mc_dropout=mc_dropout)[
        "probs"
    ]


@pytest.mark.parametrize("how", ["swapped", "sampled"])
@pytest.mark.parametrize("family", FAMILIES)
def test_replicas_of_a_batch_run_the_blocks_below_the_random_one_once(
    tmp_path, backbones, family, how, monkeypatch
):
    """With H-STO swapped into the top block (or STO sampled there post hoc), the R = 4
    replicas of a batch pass the lower block once (16 rows, not 64), and the predictive is the
    one computed on every copy; the hooks are gone afterwards."""
    image = family == "vit"
    swap = '[model.swap]\nlayers = [-1]\nattention = { kind = "h_sto" }\n'
    model = write_spec(tmp_path, backbones[family], swap if how == "swapped" else "", image)
    spec, _ = with_local_backbone(load_model_spec(model))
    data = load_data(spec.data, spec_folder(spec))
    classifier = build_classifier(spec, data)
    lower = block_stack(classifier.backbone)[0]
    rows = rows_seen(attention_blocks(lower)[0].module)
    sampled = classifier.sampled_attention([-1], 1.0) if how == "sampled" else nullcontext()
    with sampled:
        shared = replicated_predictive(classifier, data.train)
        assert max(rows) == 16 and not lower._forward_hooks and not lower._forward_pre_hooks
        rows.clear()
        monkeypatch.setattr(BackboneClassifier, "replicas_shared", lambda *_: nullcontext())
        every_copy = replicated_predictive(classifier, data.train)
    assert max(rows) == 64
    np.testing.assert_allclose(shared, every_copy, rtol=1e-5, atol=1e-6)


def test_mc_dropout_replicas_pass_every_block_and_a_batch_of_other_size_runs_as_it_is(
    tmp_path, backbones
):
    """Dropout kept on makes every copy differ from the embeddings on: MC dropout's replicas
    pass the lower block in full. A batch that is not R equal copies (R does not divide it)
    runs unchanged."""
    swap = '[model.swap]\nlayers = [-1]\nattention = { kind = "h_sto" }\n'
    spec, _ = with_local_backbone(load_model_spec(write_spec(tmp_path, backbones["bert"], swap)))
    data = load_data(spec.data, spec_folder(spec))
    classifier = build_classifier(spec, data)
    backbone = classifier.backbone.eval()
    rows = rows_seen(attention_blocks(block_stack(backbone)[0])[0].module)
    replicated_predictive(classifier, data.train, mc_dropout=True)
    assert max(rows) == 64
    rows.clear()
    inputs = model_inputs("bert", backbones["bert"])  # 3 rows
    with torch.no_grad():
        pyro.set_rng_seed(0)
        alone = backbone(**inputs).last_hidden_state
        with once_below_randomness(backbone, 2):
            pyro.set_rng_seed(0)
            inside = backbone(**inputs).last_hidden_state
    assert rows == [3, 3]
    torch.testing.assert_close(inside, alone, rtol=0, atol=0)


def test_one_pass_over_the_training_split_serves_the_laplace_and_the_feature_scores(
    tmp_path, backbones, monkeypatch
):
    """A MAP backbone run without local randomness: evaluation passes the training split once
    for the last-layer Laplace and the feature scores together (one pass fewer than each its
    own), and gives the same metrics and class probabilities (the feature scores within float
    rounding: the average of S equal feature rows rounded them)."""
    inference = tiny_inference(tmp_path / "inference", "map")
    text = inference.read_text().replace("[predictive]", "[predictive]\nposthoc = ['laplace']")
    inference.write_text(text)
    run = probtrans.fit(write_spec(tmp_path, backbones["bert"]), inference, out=tmp_path / "run")
    n_train = len(run.data.train)
    evaluated = {}
    for shared in (True, False):
        if not shared:
            monkeypatch.setattr(
                probtrans.runs.evaluation, "shared_training_features", lambda *_: None
            )
        folder = shutil.copytree(run.path, tmp_path / f"shared_{shared}")
        loaded = probtrans.Run.load(folder)
        rows = rows_seen(attention_blocks(loaded.classifier.backbone)[0].module)
        metrics = probtrans.runs.evaluation.evaluate(loaded)
        with np.load(folder / "probs.npz") as kept:
            evaluated[shared] = (sum(rows), metrics, {name: kept[name] for name in kept.files})
    assert evaluated[False][0] - evaluated[True][0] == n_train
    assert evaluated[True][1] == evaluated[False][1]
    for name, value in evaluated[False][2].items():  # feature scores: the mean of S equal
        if value.dtype.kind == "f":
            scale = np.abs(value).max(initial=1.0)
            np.testing.assert_allclose(evaluated[True][2][name], value, atol=1e-6 * scale)
        else:
            np.testing.assert_array_equal(evaluated[True][2][name], value)


def test_images_are_standardised_with_the_backbones_image_processor(tmp_path, backbones):
    """A ViT backbone's image processor (mean 0.5, std 0.25) replaces the data's own
    standardisation in training, in the run folder and for new images."""
    model = tmp_path / "vit.toml"
    model.write_text(
        f'[data]\nname = "digits"\n\n[model]\nbackbone = "{backbones["vit"]}"\npooling = "cls"\n'
    )
    spec, backbone = with_local_backbone(load_model_spec(model))
    own = load_data(spec.data, spec_folder(spec))
    from probtrans.resolve import as_backbone_reads

    read = as_backbone_reads(own, backbone)
    assert own.scaling.mean is None  # the digits' pixels are in [0, 1] as they are
    assert read.scaling.mean == (0.5,) and read.scaling.std == (0.25,)
    torch.testing.assert_close(read.train.inputs, (own.train.inputs - 0.5) / 0.25)
    run = fit(tmp_path, model, "map")
    saved = json.loads((run.path / "data.json").read_text())
    assert saved["scaling"]["mean"] == [0.5] and saved["scaling"]["std"] == [0.25], saved
    pixels = torch.rand(3, 8, 8)
    inputs, _ = probtrans.Run.load(run.path).data.encode(pixels)
    torch.testing.assert_close(inputs, ((pixels - 0.5) / 0.25)[:, None])


def test_a_frozen_backbone_trains_with_pyros_global_param_store_without_a_warning(backbones):
    """A user's own SVI in Pyro's default mode (the global param store) over a frozen backbone
    in training mode (dropout on) with H-STO swapped in: ``pyro.module`` would warn
    once for each frozen parameter (a flood for a real model); the backbone is frozen on
    purpose, so no warning is shown, and what is trainable (the swapped layer's own
    parameters) is registered in the param store and trained."""
    from pyro.infer import SVI, Trace_ELBO
    from pyro.infer.autoguide import AutoNormal

    backbone = pretrained(backbones["bert"])
    backbone.requires_grad_(False)
    encoder = probtrans.swap_attention(backbone.train(), [-1], "h_sto")

    class Model(PyroModule):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, ids, mask, y=None):
            weight = pyro.sample(
                "w", pyro.distributions.Normal(0.0, 1.0).expand([32, 2]).to_event(2)
            )
            with pyro.plate("data", len(ids)):
                hidden = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
                logits = hidden.mean(-2) @ weight
                return pyro.sample("y", pyro.distributions.Categorical(logits=logits), obs=y)

    inputs = model_inputs("bert", backbones["bert"])
    ids, mask, labels = inputs["input_ids"], inputs["attention_mask"], torch.tensor([0, 1, 0])
    model = probtrans.self_guided(Model())
    pyro.clear_param_store()
    svi = SVI(model, AutoNormal(model), pyro.optim.Adam({"lr": 1e-2}), Trace_ELBO())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            assert math.isfinite(svi.step(ids, mask, labels))
    frozen = [str(w.message) for w in caught if "requires_grad=False" in str(w.message)]
    assert frozen == []
    names = set(pyro.get_param_store().keys())
    own = {name for name in names if ".attention.self.attn." in name}
    assert own and "AutoNormal.locs.w" in names  # the swapped layer's parameters are trained
    assert not any("word_embeddings" in name or "query" in name for name in names)  # frozen
    pyro.clear_param_store()


def test_activation_checkpointing_of_a_swapped_model_is_refused_in_training(backbones):
    """Checkpointing reruns each block in the backward pass outside Pyro's handlers, where the
    swapped layer draws again (torch's CheckpointError, or another draw's gradient): refused at
    the forward that would train so, naming the switch; in eval mode, and once it is off, the
    model runs."""
    model = pretrained(backbones["bert"])
    model.activation_checkpointing_enable()  # the same as gradient_checkpointing_enable()
    encoder = probtrans.swap_attention(model, [-1], "h_sto")
    inputs = model_inputs("bert", backbones["bert"])
    encoder.train()
    with pytest.raises(ProbtransError, match=r"activation checkpointing is on.*disable\(\)"):
        encoder(**inputs)
    encoder.eval()
    assert torch.isfinite(encoder(**inputs).last_hidden_state).all()
    model.activation_checkpointing_disable()
    encoder.train()
    encoder(**inputs).last_hidden_state.sum().backward()


def test_a_swapped_layer_under_vectorised_plates_is_refused_in_one_line(backbones):
    """``Predictive(parallel=True)`` around a Hugging Face model with H-STO swapped in: one
    error naming the layer, the shapes and ``parallel=False``, not a shape error from inside
    transformers; ``parallel=False`` samples."""
    from pyro.infer import Predictive

    encoder = probtrans.swap_attention(pretrained(backbones["bert"]), [-1], "h_sto")

    class Model(PyroModule):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, ids, mask):
            with pyro.plate("data", len(ids)):
                hidden = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
                return pyro.deterministic("pooled", hidden.mean(-2), event_dim=1)

    inputs = model_inputs("bert", backbones["bert"])
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    with pytest.raises(ProbtransError, match=r"layer\.1\.attention\.self\.attn: .*use parallel"):
        Predictive(Model(), num_samples=3, parallel=True)(ids, mask)
    pooled = Predictive(Model(), num_samples=3, parallel=False)(ids, mask)["pooled"]
    assert pooled.shape == (3, 3, 32)


def test_a_decoders_causal_blocks_are_refused_and_left_unchanged(backbones):
    """A BERT built as a decoder attends causally; probtrans attention attends both ways, so
    the swap is refused before the model changes, not run as a silently bidirectional model."""
    from transformers import AutoConfig, AutoModel

    config = AutoConfig.from_pretrained(backbones["bert"], is_decoder=True)
    decoder = AutoModel.from_config(config).eval()
    with pytest.raises(ConfigError, match=r"attends causally \(a decoder's block\)"):
        probtrans.swap_attention(decoder, "all", "softmax")
    assert decoder.config._attn_implementation != "probtrans"
    assert not any("attn" in block.module._modules for block in attention_blocks(decoder))


def test_a_fused_familys_key_map_is_the_keys_part_of_its_stacked_map(backbones):
    """ModernBERT projects queries, keys and values with one map; the key map probtrans gives
    its swapped layers (H-STO's centroids, SGPA's global keys) is the middle third of that map's
    output, adapters included."""
    from probtrans.backbone.lora import add_lora
    from probtrans.backbone.swap import attention_blocks

    model = pretrained(backbones["modernbert"])
    add_lora(model, ["Wqkv"], 2, 4.0)
    for block in attention_blocks(model):
        torch.nn.init.normal_(block.module.Wqkv.lora_b)  # adapters that change the map
    tokens = torch.randn(5, 32)
    for block in attention_blocks(model):
        stacked = block.module.Wqkv(tokens)  # (5, 3 · 32): queries, keys, values
        assert block.width == 32
        torch.testing.assert_close(block.key_map(tokens), stacked[:, 32:64])


def test_a_sliding_window_block_is_refused_and_global_ones_swap(tmp_path):
    """ModernBERT alternates global and sliding-window attention; probtrans attention sees every
    token, so a sliding-window block is refused before the model changes, and a global one
    swaps with the pretrained outputs unchanged."""
    layer_types = ["full_attention", "sliding_attention"]
    folder = save_tiny_backbone("modernbert", tmp_path / "mixed", layer_types=layer_types)
    inputs = model_inputs("modernbert", folder)
    reference, model = pretrained(folder), pretrained(folder)
    with pytest.raises(ConfigError, match=r"layers\.1\.attn .* sliding window of \d+ tokens"):
        probtrans.swap_attention(model, "all", "softmax")
    assert model.config._attn_implementation != "probtrans"
    blocks = swap_blocks(model, [0], "softmax")
    calls = count_calls(blocks)
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state
        given = model(**inputs).last_hidden_state
    assert len(calls) == 1
    torch.testing.assert_close(given, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("positions", ["absolute", "rotary"])
def test_a_block_that_scales_its_own_queries_swaps_with_the_pretrained_outputs(positions):
    """ESM scales its queries by 1/√d_head itself (before its rotary positions) and asks the
    attention function for a scale of 1; a swapped layer reads the block's logits, not
    logits scaled twice. The query maps are enlarged so that the attention is far from
    uniform (random weights give nearly equal logits, where a wrong scale hardly shows)."""
    from transformers import EsmConfig, EsmModel

    config = EsmConfig(
        **TINY_SIZES,
        vocab_size=33,
        max_position_embeddings=64,
        pad_token_id=1,
        position_embedding_type=positions,
    )
    torch.manual_seed(0)
    reference = EsmModel(config).eval()
    for block in attention_blocks(reference):
        block.module.query.weight.data.mul_(30.0)
        block.module.key.weight.data.mul_(30.0)
    swapped = EsmModel(config).eval()
    swapped.load_state_dict(reference.state_dict())
    blocks = swap_blocks(swapped, "all", "softmax")
    calls = count_calls(blocks)
    ids = torch.randint(4, 33, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    with torch.no_grad():
        expected = reference(input_ids=ids, attention_mask=mask).last_hidden_state
        given = swapped(input_ids=ids, attention_mask=mask).last_hidden_state
    assert len(calls) == 2
    real = mask.bool()
    torch.testing.assert_close(given[real], expected[real], rtol=0, atol=1e-5)


def test_a_backbone_sharing_one_block_among_its_layers_is_refused_and_left_unchanged():
    """ALBERT runs one self-attention module in every layer: a layer swapped into it would run
    in all of them whichever layer was named, so swapping (and sampling post hoc) is refused
    before the model changes."""
    from transformers import AlbertConfig, AlbertModel

    config = AlbertConfig(
        **{**TINY_SIZES, "num_hidden_layers": 3}, vocab_size=40, embedding_size=16
    )
    model = AlbertModel(config).eval()
    assert len(attention_blocks(model)) == 1
    message = r"runs 1 self-attention module\(s\) in its 3 layers"
    with pytest.raises(ConfigError, match=message):
        probtrans.swap_attention(model, [-1], "h_sto")
    with pytest.raises(ConfigError, match=message):
        with sampled_blocks(model, [-1], 1.0):
            pass
    assert model.config._attn_implementation != "probtrans"
    assert not any("attn" in block.module._modules for block in attention_blocks(model))


def test_an_encoder_decoder_models_encoder_swaps_and_the_whole_model_is_refused(tmp_path):
    """BART's decoder attends causally and to the encoder's tokens: a swap into the whole model
    is refused before it changes (its top block would be a cross-attention), and its encoder's
    blocks, all of them, swap with the pretrained outputs unchanged."""
    folder = save_tiny_backbone("bart", tmp_path / "bart")
    whole = pretrained(folder)
    with pytest.raises(ConfigError, match=r"BartModel is an encoder-decoder model.*get_encoder"):
        probtrans.swap_attention(whole, [-1], "h_sto")
    with pytest.raises(ConfigError, match=r"BartModel is an encoder-decoder model"):
        with sampled_blocks(whole, [-1], 1.0):
            pass
    assert not any("attn" in block.module._modules for block in attention_blocks(whole))
    inputs = model_inputs("bart", folder)
    reference, encoder = pretrained(folder).get_encoder(), whole.get_encoder()
    calls = count_calls(swap_blocks(encoder, "all", "softmax"))
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state
        given = encoder(**inputs).last_hidden_state
    assert len(calls) == 2
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(given[real], expected[real], rtol=0, atol=1e-5)


@pytest.mark.parametrize("family", ENCODER_DECODERS)
def test_a_classifier_of_an_encoder_decoder_model_reads_texts_with_its_encoder(tmp_path, family):
    """A T5 or BART backbone is its encoder alone (T5's whole model fails without target
    tokens for its decoder): a fit with adapters on its query and value maps trains, and the
    run reloads from its own folder to the same predictions."""
    folder = save_tiny_backbone(family, tmp_path / family)
    targets = '["q", "v"]' if family == "t5" else '["q_proj", "v_proj"]'
    tables = f'[model.prior]\nweights = "lora"\nlora = {{ r = 2, targets = {targets} }}\n'
    run = fit(tmp_path, write_spec(tmp_path, folder, tables), "mfvi")
    encoder = type(pretrained(folder).get_encoder())
    assert type(run.classifier.backbone) is encoder
    texts = ["a wonderful film", "the worst plot", "bad acting and a dull ending"]
    expected = run.predict(texts, samples=3, seed=1)
    given = probtrans.Run.load(run.path).predict(texts, samples=3, seed=1)
    np.testing.assert_allclose(given["p_0"], expected["p_0"], rtol=0, atol=1e-6)
    assert not np.allclose(given["p_0"], given["p_0"][0])  # the texts get different answers


@pytest.mark.parametrize(
    "tables",
    ["[model.swap]\nlayers = [-1]\n", "[model.head]\nkind = 'random_features'\n"],
    ids=["swap", "sngp"],
)
def test_images_of_another_size_start_a_swap_and_sngp_resized(tmp_path, backbones, tables):
    """Images of another size than the backbone's are resized for it: also the pretrained
    tokens that start a swapped layer and the features that give SNGP's length scale (they
    were passed as they were, and the ViT refused them)."""
    x = np.random.default_rng(0).random((40, 1, 16, 16), dtype=np.float32)  # the ViT's: 8×8
    np.savez(tmp_path / "big.npz", x=x, y=np.arange(40) % 2)
    text = (
        f'[data]\ntrain = "big.npz"\nkind = "image"\n\n[model]\nbackbone = "{backbones["vit"]}"\n'
        f"dropout = 0.0\n{tables}"
    )
    (tmp_path / "model.toml").write_text(text)
    spec, _ = with_local_backbone(load_model_spec(tmp_path / "model.toml"))
    data = load_data(spec.data, spec_folder(spec))
    classifier = build_classifier(spec, data).eval()
    _, inputs, mask, _ = next(data.train.batches(4))
    with torch.no_grad():
        assert classifier(inputs, mask).shape == (4, 2)


def test_a_decoder_backbone_pools_its_last_real_token_and_its_first_is_refused(tmp_path):
    """GPT-2 attends causally: its first token sees no other, so ``cls`` pooling is refused
    naming ``last`` (as is ``pooler``, which it lacks, without offering ``cls``); ``last``
    pools each text's last real token of the pretrained outputs (its tokenizer has no padding
    token: it pads with its end-of-text token, masked out)."""
    from probtrans.classifier import pooled

    folder = save_tiny_gpt2(tmp_path / "gpt2")
    cls = write_spec(tmp_path, folder, "pooling = 'cls'\n[model.prior]\nweights = 'none'\n")
    spec, _ = with_local_backbone(load_model_spec(cls))
    data = load_data(spec.data, spec_folder(spec))
    with pytest.raises(ConfigError, match=r"model.pooling = 'cls': .* attends causally.*'last'"):
        build_classifier(spec, data)
    assert data.tokenizer.padding["pad_token"] == "<|endoftext|>"
    pooler = write_spec(tmp_path, folder, "pooling = 'pooler'\n[model.prior]\nweights = 'none'\n")
    spec, _ = with_local_backbone(load_model_spec(pooler))
    with pytest.raises(ConfigError, match=r"has no pooler layer; use 'last' or 'mean'$"):
        build_classifier(spec, data)
    last = write_spec(tmp_path, folder, "pooling = 'last'\n[model.prior]\nweights = 'none'\n")
    spec, _ = with_local_backbone(load_model_spec(last))
    classifier = build_classifier(spec, data).eval()
    _, inputs, mask, _ = next(data.train.batches(8))
    assert not mask.all() and (inputs[~mask] == 0).all()  # padded, with the end-of-text id
    with torch.no_grad():
        hidden = pretrained(folder)(input_ids=inputs, attention_mask=mask).last_hidden_state
        expected = hidden[torch.arange(len(inputs)), mask.sum(1) - 1]  # right padding
        torch.testing.assert_close(classifier.encode(inputs, mask), expected, rtol=0, atol=1e-5)
    x = torch.randn(2, 4, 3)
    left = torch.tensor([[False, True, True, True], [False, False, True, True]])
    torch.testing.assert_close(pooled(x, left, "last"), x[:, -1])  # left padding: the last
    right = torch.tensor([[True, True, False, False], [True, True, True, True]])
    torch.testing.assert_close(pooled(x, right, "last"), x[[0, 1], [1, 3]])


def test_lora_adapts_the_conv1d_maps_of_gpt2(tmp_path):
    """GPT-2's linear maps are ``transformers``' Conv1D (x W + b, W stored (d_in, d_out)):
    LoRA adapts them as it does nn.Linear, starting at the pretrained map, and a fit trains
    the adapters and predicts."""
    from probtrans.backbone.lora import add_lora

    folder = save_tiny_gpt2(tmp_path / "gpt2")
    model = pretrained(folder)
    tokens = torch.randn(5, 32)
    before = model.h[0].attn.c_attn(tokens)
    adapters = add_lora(model, ["c_attn"], 2, 4.0)
    assert sorted(adapters) == ["h.0.attn.c_attn", "h.1.attn.c_attn"]
    adapter = adapters["h.0.attn.c_attn"]
    assert adapter.lora_a.shape == (2, 32) and adapter.lora_b.shape == (96, 2)
    torch.testing.assert_close(adapter(tokens), before)  # B = 0: the pretrained map
    torch.nn.init.normal_(adapter.lora_b)
    update = 2.0 * tokens @ adapter.lora_a.T @ adapter.lora_b.T  # (α / r) B A x
    torch.testing.assert_close(adapter(tokens), before + update)
    tables = 'pooling = "last"\n[model.prior]\nweights = "lora"\nlora = { targets = ["c_attn"] }\n'
    run = fit(tmp_path, write_spec(tmp_path, folder, tables), "mfvi")
    predicted = run.predict(["a wonderful film", "the worst plot"], samples=3, seed=1)
    assert not np.allclose(predicted["p_0"], predicted["p_0"][0])


def test_lora_adapts_the_query_and_value_maps_of_families_whose_attention_cannot_swap():
    """DeBERTa (disentangled logits), MPNet and T5 (relative position biases) keep attention
    probtrans cannot take over, but LoRA adapts their query and value maps unless told
    otherwise; T5's encoder, whose heads may be narrower than its tokens, is refused a swap
    with the sizes rather than crashing in its first layer."""
    from transformers import (
        DebertaV2Config,
        DebertaV2Model,
        MPNetConfig,
        MPNetModel,
        T5EncoderModel,
    )

    from probtrans.backbone.families import lora_targets
    from tests.tiny_backbones import tiny_config

    deberta = DebertaV2Model(DebertaV2Config(**TINY_SIZES, vocab_size=40))
    mpnet = MPNetModel(MPNetConfig(**TINY_SIZES, vocab_size=40))
    t5 = T5EncoderModel(tiny_config("t5", vocab_size=40))
    assert lora_targets(deberta) == ["query_proj", "value_proj"]
    assert lora_targets(mpnet) == ["q", "v"]
    assert lora_targets(t5) == ["q", "v"]
    with pytest.raises(ConfigError, match="DisentangledSelfAttention.*does not call"):
        probtrans.swap_attention(deberta, "all", "softmax")
    narrow = T5EncoderModel(tiny_config("t5", vocab_size=40, d_kv=16))  # 4 heads of 16: 64
    with pytest.raises(ConfigError, match="tokens of size 32 to keys of size 64"):
        probtrans.swap_attention(narrow, [-1], "sgpa")
    assert narrow.config._attn_implementation != "probtrans"


def test_key_padding_reads_a_padding_mask_and_refuses_one_that_differs_between_queries():
    from probtrans.backbone.swap import key_padding

    keys = torch.tensor([[True, True, False], [True, True, True]])
    padding = keys[:, None, None, :].expand(2, 1, 3, 3)  # (B, 1, L_q, L): the same for each query
    assert torch.equal(key_padding(padding), keys)
    additive = torch.zeros(2, 1, 3, 3).masked_fill(~padding, torch.finfo(torch.float32).min)
    assert torch.equal(key_padding(additive), keys)
    causal = torch.ones(3, 3, dtype=torch.bool).tril().expand(2, 1, 3, 3)
    with pytest.raises(ProbtransError, match="differs between queries"):
        key_padding(causal)
    old_style = torch.zeros(2, 1, 3, 3).masked_fill(~padding, -10000.0)  # BERT's (1 − m) · −10⁴
    assert torch.equal(key_padding(old_style), keys)
    bias = additive + torch.linspace(-0.5, 0.5, 9).reshape(3, 3)  # a position bias, as BEiT's
    with pytest.raises(ProbtransError, match="a bias on its logits"):
        key_padding(bias)


def test_a_model_of_stages_with_their_own_head_counts_is_refused_in_one_line():
    """Swin gives one number of heads per stage; the swap says so instead of failing on it."""
    from transformers import SwinConfig, SwinModel

    config = SwinConfig(
        embed_dim=16, depths=[1, 1], num_heads=[2, 4], image_size=16, patch_size=2, window_size=2
    )
    model = SwinModel(config)
    with pytest.raises(
        ConfigError, match=r"num_attention_heads = \[2, 4\], not one number of heads"
    ):
        probtrans.swap_attention(model, "all", "softmax")
    assert model.config._attn_implementation != "probtrans"


def test_a_relative_position_bias_is_refused_not_dropped():
    """BEiT adds a relative position bias to its logits through the attention mask; a block
    swapped to probtrans attention refuses it at the call rather than attending without it."""
    from transformers import BeitConfig, BeitModel

    config = BeitConfig(
        **TINY_SIZES,
        image_size=16,
        patch_size=4,
        use_relative_position_bias=True,
    )
    torch.manual_seed(0)
    model = BeitModel(config).eval()
    for name, parameter in model.named_parameters():
        if "relative_position_bias_table" in name:
            parameter.data.uniform_(-0.5, 0.5)  # small: a mask read as ">-1 attends" drops it
    probtrans.swap_attention(model, "all", "softmax")
    with pytest.raises(ProbtransError, match="a bias on its logits"), torch.no_grad():
        model(pixel_values=torch.randn(2, 3, 16, 16))


def test_a_swapped_block_asking_for_what_probtrans_attention_does_not_apply_is_refused():
    """An attention function's keywords that change the weights (a logit cap, a position bias,
    causal masking, ...) are refused at the call rather than ignored; their absence is not."""
    from probtrans.backbone.swap import probtrans_attention

    block = torch.nn.Module()
    block.attn = probtrans.nn.SoftmaxAttention(8, 2, projections=False)
    q = k = v = torch.randn(1, 2, 3, 4)
    out, _ = probtrans_attention(block, q, k, v, None, sliding_window=None, is_causal=False)
    assert out.shape == (1, 3, 2, 4)
    with pytest.raises(ProbtransError, match=r"softcap=30\.0, which probtrans attention does"):
        probtrans_attention(block, q, k, v, None, softcap=30.0)
    bias = torch.zeros(1, 2, 3, 3)  # T5's relative position bias: a tensor, named by its shape
    with pytest.raises(ProbtransError, match=r"position_bias=a tensor of shape \(1, 2, 3, 3\)"):
        probtrans_attention(block, q, k, v, None, position_bias=bias)
