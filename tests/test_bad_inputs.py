"""Bad inputs to every command (issue 19): spec files, command-line options, data files, caches
and run folders. Each case must end with exit status 2 and one ``error:`` line naming the file or
field, and leave every file under its folder as it was (nothing created, changed or removed, no
``*.partial`` left behind; an earlier run folder survives)."""

from __future__ import annotations

import errno
import gzip
import json
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import datasets.config
import huggingface_hub.constants
import numpy as np
import pytest
import torch

from probtrans.cli import main
from probtrans.storage.checkpoint import load_checkpoint
from tests.conftest import TINY_MODEL, TINY_TRAIN, tiny_inference
from tests.test_corrections import TINY as TINY_SEGMENTATION

TINY_TEXT_MODEL = """
[data]
name = "{name}"
max_len = 16

[model]
d_model = 16
n_heads = 2
n_layers = 1
d_ff = 32
max_positions = 16
"""

TINY_INFERENCE = '[guide]\nname = "delta"\n' + TINY_TRAIN


class Exploit:
    """Unpickling this would write ``marker``: a checkpoint must never run it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code from a checkpoint ran"))


@dataclass
class Expect:
    """A command line, the substrings its ``error:`` line must hold and those it must not."""

    argv: list[str]
    names: tuple[str, ...]
    absent: tuple[str, ...] = ()
    max_chars: int | None = None  # the longest the error line may be
    max_seconds: float | None = None  # the longest the command may take


class Workspace:
    """A case's folder: the working directory, cache, data and run folders all live in it."""

    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, request) -> None:
        self.root = root
        self.monkeypatch = monkeypatch
        self.request = request
        (root / "cwd").mkdir()
        monkeypatch.chdir(root / "cwd")  # a stray default output folder would show up here
        self.cache = root / "cache"
        self.cache.mkdir()
        monkeypatch.setenv("PROBTRANS_CACHE_DIR", str(self.cache))
        # text data missing locally falls back to the Hugging Face hub: never go online, and
        # never read a hub cache outside this folder
        for name in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
            monkeypatch.setenv(name, "1")
        monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
        monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", root / "hf" / "datasets")
        monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(root / "hf" / "hub"))
        self.marker = root / "pwned"

    # ------------------------------------------------------------------ files
    def write(self, name: str, content: str | bytes) -> Path:
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    def model(self, extra: str = "", base: str = TINY_MODEL) -> Path:
        return self.write("model.toml", base + extra)

    def text_model(self, name: str = "cola", extra: str = "") -> Path:
        return self.write("text.toml", TINY_TEXT_MODEL.format(name=name) + extra)

    def inference(self, extra: str = "", before: str = "") -> Path:
        """The tiny inference spec, ``before`` (new tables) first, ``extra`` at its end."""
        return self.write("inference.toml", before + TINY_INFERENCE + extra)

    def segmentation(self, extra: str = "") -> Path:
        return self.write("segmentation.toml", TINY_SEGMENTATION + extra)

    def evil(self, name: str) -> Path:
        """A torch file whose unpickling would run code."""
        path = self.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"format": 1, "model_state": Exploit(self.marker)}, path)
        return path

    def earlier_run(self, name: str = "run") -> Path:
        """A finished run folder that a failed command must leave as it is."""
        out = self.root / name
        out.mkdir()
        (out / "metrics.json").write_text('{"accuracy": 0.5}\n')
        (out / "checkpoint.pt").write_bytes(b"an earlier checkpoint")
        return out

    def fitted_run(self, name: str = "run") -> Path:
        """A copy of a real run folder (the tiny model fitted for one epoch)."""
        source = self.request.getfixturevalue("fitted_run")
        return Path(shutil.copytree(source, self.root / name))

    def fitted_text_run(self, name: str = "run") -> Path:
        """A copy of a real run folder on text files (a tokenizer.json in it)."""
        source = self.request.getfixturevalue("fitted_text_run")
        return Path(shutil.copytree(source, self.root / name))

    def backbone(self, family: str = "bert", name: str | None = None) -> Path:
        """A copy of a tiny pretrained-style model (:mod:`tests.tiny_backbones`) in ``name``."""
        source = self.request.getfixturevalue("tiny_backbones") / family
        return Path(shutil.copytree(source, self.root / (name or family)))

    def backbone_model(self, extra: str = "", backbone: str | None = None, **data: str) -> Path:
        """A model spec of the tiny BERT (or ``backbone``) on a CSV of texts, ``data`` set in
        its ``[data]`` table and ``extra`` at its end."""
        if backbone is None:
            backbone = str(self.backbone())
        if "train" not in data:
            self.write("train.csv", own_rows())
        values = {"kind": '"text"', "train": '"train.csv"', "max_len": "16", **data}
        table = "".join(f"{key} = {value}\n" for key, value in values.items())
        model = f'[model]\nbackbone = "{backbone}"\npooling = "cls"\n'
        return self.write("backbone.toml", f"[data]\n{table}\n{model}{extra}")

    def data_dir(self, files: dict[str, bytes]) -> Path:
        """``$PROBTRANS_DATA_DIR`` holding ``files`` (paths relative to it)."""
        root = self.root / "data"
        root.mkdir()
        for name, content in files.items():
            self.write(f"data/{name}", content)
        self.monkeypatch.setenv("PROBTRANS_DATA_DIR", str(root))
        return root

    # ------------------------------------------------------------------ command lines
    def fit(self, model: Path | None = None, inference: Path | None = None) -> list[str]:
        """``probtrans fit`` into an earlier run folder that must survive."""
        model = model or self.model()
        inference = inference or self.inference()
        out = self.earlier_run()
        return ["fit", str(model), "--inference", str(inference), "--out", str(out), "--quiet"]


Build = Callable[[Workspace], Expect]
CASES: dict[str, Build] = {}


def case(name: str) -> Callable[[Build], Build]:
    def register(build: Build) -> Build:
        assert name not in CASES, name
        CASES[name] = build
        return build

    return register


def cola_rows(n: int = 20) -> bytes:
    """``n`` well-formed rows of CoLA's raw TSV (source, label, mark, sentence)."""
    return b"".join(f"src\t{i % 2}\t\tsentence number {i} here .\n".encode() for i in range(n))


def good_cola() -> dict[str, bytes]:
    return {
        "cola/raw/in_domain_train.tsv": cola_rows(),
        "cola/raw/in_domain_dev.tsv": cola_rows(10),
        "cola/raw/out_of_domain_dev.tsv": cola_rows(10),
    }


def imdb_rows(n: int = 10) -> bytes:
    lines = [f'{{"text": "review {i} was fine", "label": {i % 2}}}' for i in range(n)]
    return gzip.compress(("\n".join(lines) + "\n").encode())


# ====================================================================== spec files (via fit)
def model_case(name: str, extra: str, *names: str) -> None:
    """A model spec (the tiny model + ``extra``) given to ``fit``: the file and ``names``."""

    @case(f"spec/model: {name}")
    def build(w: Workspace) -> Expect:
        model = w.model(extra)
        return Expect(w.fit(model), (str(model), *names))


def inference_case(name: str, extra: str, *names: str) -> None:
    """An inference spec (the tiny one + ``extra``) given to ``fit``: the file and ``names``."""

    @case(f"spec/inference: {name}")
    def build(w: Workspace) -> Expect:
        inference = w.inference(extra)
        return Expect(w.fit(inference=inference), (str(inference), *names))


@case("spec/model: missing file")
def _(w: Workspace) -> Expect:
    missing = w.root / "nope.toml"
    return Expect(w.fit(missing), (str(missing), "no such file"))


@case("spec/model: a folder")
def _(w: Workspace) -> Expect:
    folder = w.root / "folder.toml"
    folder.mkdir()
    return Expect(w.fit(folder), (f"{folder}: is a folder, not a file",))


@case("spec/model: binary garbage")
def _(w: Workspace) -> Expect:
    path = w.write("model.toml", bytes(range(256)) * 4)
    return Expect(w.fit(path), (str(path), "not UTF-8"))


@case("spec/model: invalid TOML syntax")
def _(w: Workspace) -> Expect:
    path = w.write("model.toml", "[model\nd_model = \n")
    return Expect(w.fit(path), (str(path), "not valid TOML"))


@case("spec/model: duplicate key")
def _(w: Workspace) -> Expect:
    path = w.write("model.toml", "[model]\nd_model = 16\nd_model = 32\n")
    return Expect(w.fit(path), (str(path), "not valid TOML"))


model_case("unknown table", "[decoder]\nlayers = 2\n", "unknown key 'decoder'")
model_case("wrong type (string)", '[model.head]\nfeatures = "many"\n', "model.head.features")
model_case("wrong type (float for int)", "[model.head]\nfeatures = 8.0\n", "model.head.features")
model_case("a table where a value goes", "[model.head.kind]\nx = 1\n", "model.head.kind")
model_case("zero", "[model.head]\nfeatures = 0\n", "model.head.features = 0: must be > 0")
model_case("negative", "[model.head]\nlengthscale = -1.0\n", "model.head.lengthscale = -1")


def _model_with(table: str, **values: str) -> str:
    """The tiny model with ``values`` set in ``table`` (a line replaced or added)."""
    lines = TINY_MODEL.splitlines()
    start = lines.index(f"[{table}]")
    for key, value in values.items():
        for i in range(start + 1, len(lines)):
            if lines[i].startswith("[") or not lines[i].strip():
                lines.insert(i, f"{key} = {value}")
                break
            if lines[i].split("=")[0].strip() == key:
                lines[i] = f"{key} = {value}"
                break
        else:
            lines.append(f"{key} = {value}")
    return "\n".join(lines) + "\n"


def edited_model_case(name: str, table: str, values: dict[str, str], *names: str) -> None:
    @case(f"spec/model: {name}")
    def build(w: Workspace) -> Expect:
        model = w.write("model.toml", _model_with(table, **values))
        return Expect(w.fit(model), (str(model), *names))


edited_model_case("unknown key", "data", {"colour": '"red"'}, "unknown key 'data.colour'")
edited_model_case("tau2 = inf", "model.attention", {"tau2": "inf"}, "model.attention.tau2 = inf")
edited_model_case("tau1 = 0", "model.attention", {"tau1": "0.0"}, "model.attention.tau1 = 0")
edited_model_case("prior.scale = inf", "model.prior", {"scale": "inf"}, "model.prior.scale = inf")
edited_model_case("unknown data set", "data", {"name": '"mnist"'}, "data.name = 'mnist'")
edited_model_case(
    "unknown attention kind", "model.attention", {"kind": '"magic"'}, "model.attention.kind"
)
edited_model_case("n_heads does not divide d_model", "model", {"n_heads": "3"}, "model.n_heads = 3")
edited_model_case("dropout = 1", "model", {"dropout": "1.0"}, "model.dropout = 1")
edited_model_case("d_model = 0", "model", {"d_model": "0"}, "model.d_model = 0")
edited_model_case("split_seed = -1", "data", {"split_seed": "-1"}, "data.split_seed = -1")
edited_model_case("val_fraction = 0.6", "data", {"val_fraction": "0.6"}, "data.val_fraction")
edited_model_case(
    "patch_size does not divide 8x8", "data", {"patch_size": "3"}, "data.patch_size = 3"
)
edited_model_case(
    "patch_size larger than the image", "data", {"patch_size": "16"}, "data.patch_size = 16"
)
edited_model_case("ood_classes out of range", "data", {"ood_classes": "[10]"}, "data.ood_classes")
edited_model_case("ood_classes negative", "data", {"ood_classes": "[-1, 9]"}, "data.ood_classes")
edited_model_case(
    "ood_classes leave one class",
    "data",
    {"ood_classes": "[0, 1, 2, 3, 4, 5, 6, 7, 8]"},
    "data.ood_classes",
)

inference_case("unknown key", "epochz = 3\n", "unknown key 'predictive.epochz'")
inference_case("unknown ood_score", 'ood_score = "mahalanobis2"\n', "predictive.ood_score")
inference_case("knn_neighbours = 0", "knn_neighbours = 0\n", "predictive.knn_neighbours")
inference_case(
    "knn_neighbours above the training rows",
    "knn_neighbours = 5000\n",
    "predictive.knn_neighbours = 5000: above the",
    "training rows",
)


def edited_inference_case(name: str, text: str, *names: str) -> None:
    """The tiny inference spec with ``text``: new tables, or the lines of its ``[guide]``."""

    @case(f"spec/inference: {name}")
    def build(w: Workspace) -> Expect:
        if text.startswith("[guide]"):
            inference = w.write(
                "inference.toml", TINY_INFERENCE.replace('[guide]\nname = "delta"\n', text)
            )
        else:
            inference = w.inference(before=text)
        return Expect(w.fit(inference=inference), (str(inference), *names))


edited_inference_case(
    "gamma = 1.5 with an exponential schedule",
    '[optim]\nschedule = "exponential"\ngamma = 1.5\n',
    "optim.gamma = 1.5",
)
edited_inference_case("lr = inf", "[optim]\nlr = inf\n", "optim.lr = inf")
edited_inference_case("lr = 0", "[optim]\nlr = 0.0\n", "optim.lr = 0")
edited_inference_case("kl_weight = nan", "[elbo]\nkl_weight = nan\n", "elbo.kl_weight = nan")
edited_inference_case(
    "weight_decay = -1", "[optim]\nweight_decay = -1.0\n", "optim.weight_decay = -1"
)
edited_inference_case("unknown guide", '[guide]\nname = "magic"\n', "guide.name = 'magic'")
edited_inference_case(
    "unknown inducing guide", '[guide]\ninducing = "full"\n', "guide.inducing = 'full'"
)
edited_inference_case("unknown ELBO", '[elbo]\nname = "renyi"\n', "elbo.name = 'renyi'")
edited_inference_case("particles as a string", '[elbo]\nparticles = "2"\n', "elbo.particles")


@case("spec/inference: unknown post-hoc variant")
def _(w: Workspace) -> Expect:
    inference = w.inference('posthoc = ["bagging"]\n')
    return Expect(w.fit(inference=inference), (str(inference), "predictive.posthoc[0]"))


@case("spec/inference: epochs = 0")
def _(w: Workspace) -> Expect:
    inference = w.inference()
    inference.write_text(inference.read_text().replace("epochs = 2", "epochs = 0"))
    return Expect(w.fit(inference=inference), (str(inference), "train.epochs = 0"))


@case("spec/inference: missing file")
def _(w: Workspace) -> Expect:
    missing = w.root / "nope.toml"
    return Expect(w.fit(inference=missing), (str(missing), "no such file"))


@case("spec/inference: a folder")
def _(w: Workspace) -> Expect:
    folder = w.root / "inference.d"
    folder.mkdir()
    return Expect(w.fit(inference=folder), (str(folder),))


@case("spec/inference: binary garbage")
def _(w: Workspace) -> Expect:
    path = w.write("inference.toml", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\xff\xfe")
    return Expect(w.fit(inference=path), (str(path), "not UTF-8"))


# ====================================================================== fit options
@case("fit: --epochs 0")
def _(w: Workspace) -> Expect:
    return Expect([*w.fit(), "--epochs", "0"], ("--epochs",))


@case("fit: --epochs -3")
def _(w: Workspace) -> Expect:
    return Expect([*w.fit(), "--epochs", "-3"], ("--epochs",))


@case("fit: --seed -1")
def _(w: Workspace) -> Expect:
    return Expect([*w.fit(), "--seed", "-1"], ("--seed",))


@case("fit: --seed 2**32")
def _(w: Workspace) -> Expect:
    return Expect([*w.fit(), "--seed", str(2**32)], ("--seed",))


@case("fit: --device tpu")
def _(w: Workspace) -> Expect:
    return Expect([*w.fit(), "--device", "tpu"], ("--device",))


@case("fit: --device cuda without a GPU")
def _(w: Workspace) -> Expect:
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device")
    return Expect([*w.fit(), "--device", "cuda"], ("--device cuda",))


@case("fit: --out below a file")
def _(w: Workspace) -> Expect:
    blocker = w.write("not-a-folder", "a file")
    argv = ["fit", str(w.model()), "--inference", str(w.inference())]
    return Expect([*argv, "--out", str(blocker / "run"), "--quiet"], (str(blocker),))


@case("run: fit --out into a folder that is not a run")
def _(w: Workspace) -> Expect:
    folder = w.root / "thesis"
    w.write("thesis/chapter1.tex", "\\section{Introduction}\n")
    argv = ["fit", str(w.model()), "--inference", str(w.inference())]
    return Expect([*argv, "--out", str(folder), "--quiet"], (str(folder),))


@case("run: fit whose DIR.partial holds other files")
def _(w: Workspace) -> Expect:
    w.write("run.partial/notes.txt", "mine")
    return Expect(w.fit(), (str(w.root / "run.partial"),))


@case("cache: text cache path is a folder")
def _(w: Workspace) -> Expect:
    w.data_dir(good_cola())
    model = w.text_model()
    cached = cache_file(w, model)
    cached.mkdir()
    return Expect(["describe", str(model)], (str(cached),))


# ====================================================================== evaluate
@case("evaluate: missing folder")
def _(w: Workspace) -> Expect:
    missing = w.root / "no-run"
    return Expect(["evaluate", str(missing), "--quiet"], (str(missing),))


@case("evaluate: a file, not a folder")
def _(w: Workspace) -> Expect:
    path = w.write("run.json", "{}")
    return Expect(["evaluate", str(path), "--quiet"], (str(path),))


@case("evaluate: no checkpoint.pt")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    (run / "checkpoint.pt").unlink()
    return Expect(["evaluate", str(run), "--quiet"], (str(run / "checkpoint.pt"),))


@case("evaluate: empty checkpoint.pt")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    (run / "checkpoint.pt").write_bytes(b"")
    return Expect(["evaluate", str(run), "--quiet"], (str(run / "checkpoint.pt"),))


@case("evaluate: --adapt em on a model without Gaussian-mixture attention")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    argv = ["evaluate", str(run), "--adapt", "em", "--quiet"]
    return Expect(argv, ("'em' adapts Gaussian-mixture attention", "'h_sto'", "use 'tent'"))


@case("evaluate: --adapt-online without --adapt")
def _(w: Workspace) -> Expect:
    return Expect(["evaluate", str(w.fitted_run()), "--adapt-online", "--quiet"], ("--adapt",))


@case("evaluate: --adapt em --adapt-online")
def _(w: Workspace) -> Expect:
    argv = ["evaluate", str(w.fitted_run()), "--adapt", "em", "--adapt-online", "--quiet"]
    return Expect(argv, ("online adaptation is for 'tent' only",))


@case("evaluate: truncated checkpoint.pt")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    data = (run / "checkpoint.pt").read_bytes()
    (run / "checkpoint.pt").write_bytes(data[: len(data) // 2])
    return Expect(["evaluate", str(run), "--quiet"], (str(run / "checkpoint.pt"),))


@case("evaluate: checkpoint.pt holding pickled code")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    w.evil("run/checkpoint.pt")
    checkpoint = str(run / "checkpoint.pt")
    return Expect(["evaluate", str(run), "--quiet"], (checkpoint,), absent=("weights_only",))


@case("evaluate: checkpoint.pt of another format")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    torch.save({"format": 99}, run / "checkpoint.pt")
    return Expect(["evaluate", str(run), "--quiet"], (str(run / "checkpoint.pt"),))


@case("evaluate: checkpoint.pt that is a list")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    torch.save([torch.zeros(2)], run / "checkpoint.pt")
    return Expect(["evaluate", str(run), "--quiet"], (str(run / "checkpoint.pt"),))


@case("evaluate: checkpoint.pt without model_state")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    torch.save({"format": 1, "guide_state": {}}, run / "checkpoint.pt")
    return Expect(["evaluate", str(run), "--quiet"], (str(run / "checkpoint.pt"),))


@case("evaluate: checkpoint.pt whose weights have other shapes")
def _(w: Workspace) -> Expect:
    from probtrans.storage.checkpoint import load_checkpoint, save_checkpoint

    run = w.fitted_run()
    state = load_checkpoint(run / "checkpoint.pt")
    state["model_state"] = {k: torch.zeros(7, 7, 7) for k in state["model_state"]}
    save_checkpoint(run / "checkpoint.pt", state)
    return Expect(["evaluate", str(run), "--quiet"], (str(run / "checkpoint.pt"),))


@case("evaluate: corrupt metrics.json")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    (run / "metrics.json").write_text('{"accuracy": 0.9, ')
    return Expect(["evaluate", str(run), "--quiet"], (str(run / "metrics.json"),))


@case("evaluate: metrics.json that is not UTF-8")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    (run / "metrics.json").write_bytes(b"\xff\xfe{}")
    return Expect(["evaluate", str(run), "--quiet"], (str(run / "metrics.json"),))


@case("evaluate: --samples 0")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    return Expect(["evaluate", str(run), "--samples", "0", "--quiet"], ("--samples",))


@case("evaluate: --samples -5")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    return Expect(["evaluate", str(run), "--samples", "-5", "--quiet"], ("--samples",))


@case("evaluate: --seed -1")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    return Expect(["evaluate", str(run), "--seed", "-1", "--quiet"], ("--seed",))


@case("evaluate: --device tpu")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    return Expect(["evaluate", str(run), "--device", "tpu", "--quiet"], ("--device",))


@case("predict: --seed -1")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    inputs = w.root / "inputs.txt"
    inputs.write_text("a text\n")
    return Expect(["predict", str(run), str(inputs), "--seed", "-1", "--quiet"], ("--seed -1",))


@case("predict: --out over an existing file of the user's")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    inputs = w.write("inputs.npz", b"")
    np.savez(inputs, x=np.zeros((2, 8, 8), dtype=np.float32))
    keep = w.write("notes/keep.csv", "my own,notes\n1,2\n")
    argv = ["predict", str(run), str(inputs), "--out", str(keep), "--quiet"]
    return Expect(argv, (f"--out {keep}: exists", "--force"))


# ====================================================================== compare
PRESET = """
title = "bad"
seeds = [0]
epochs = 1

[[method]]
name = "MAP"
model = "{model}"
inference = "{inference}"
"""


def preset(w: Workspace, extra: str = "", **paths: Path) -> Path:
    model, inference = paths.get("model") or w.model(), paths.get("inference") or w.inference()
    return w.write("preset.toml", PRESET.format(model=model, inference=inference) + extra)


def compare(w: Workspace, *args: str) -> list[str]:
    return ["compare", *args, "--out", str(w.root / "cmp"), "--quiet"]


@case("compare: missing preset")
def _(w: Workspace) -> Expect:
    missing = w.root / "nope.toml"
    return Expect(compare(w, "--preset", str(missing)), (str(missing), "no such file"))


@case("compare: preset with an unknown key")
def _(w: Workspace) -> Expect:
    path = preset(w)
    path.write_text("colour = 'red'\n" + path.read_text())
    return Expect(compare(w, "--preset", str(path)), (str(path), "unknown key 'colour'"))


@case("compare: preset method with an unknown key")
def _(w: Workspace) -> Expect:
    path = preset(w, "weight = 2\n")
    return Expect(compare(w, "--preset", str(path)), (str(path), "method[0].weight"))


@case("compare: preset naming a missing model spec")
def _(w: Workspace) -> Expect:
    path = preset(w, model=w.root / "gone.toml")
    return Expect(compare(w, "--preset", str(path)), (str(path), "gone.toml"))


@case("compare: preset naming a bad model spec")
def _(w: Workspace) -> Expect:
    model = w.write("model.toml", _model_with("model.attention", tau2="inf"))
    path = preset(w, model=model)
    return Expect(compare(w, "--preset", str(path)), (str(model), "model.attention.tau2"))


@case("compare: preset with no method")
def _(w: Workspace) -> Expect:
    path = w.write("preset.toml", 'title = "empty"\nmethod = []\n')
    return Expect(compare(w, "--preset", str(path)), (str(path), "method"))


@case("compare: preset with an unknown variant")
def _(w: Workspace) -> Expect:
    path = preset(w, 'variant = "bagging"\n')
    return Expect(compare(w, "--preset", str(path)), (str(path), "method[0].variant"))


@case("compare: preset with an unknown id_metric")
def _(w: Workspace) -> Expect:
    path = preset(w)
    path.write_text('id_metric = "f1"\n' + path.read_text())
    return Expect(compare(w, "--preset", str(path)), (str(path), "id_metric = 'f1'"))


@case("compare: both model specs and --preset")
def _(w: Workspace) -> Expect:
    argv = compare(w, str(w.model()), "--preset", str(preset(w)))
    return Expect(argv, ("--preset",))


@case("compare: neither model specs nor --preset")
def _(w: Workspace) -> Expect:
    return Expect(compare(w), ("--preset",))


@case("compare: --seeds -1")
def _(w: Workspace) -> Expect:
    argv = compare(w, str(w.model()), "--inference", str(w.inference()), "--seeds", "-1")
    return Expect(argv, ("--seeds",))


@case("compare: --epochs 0")
def _(w: Workspace) -> Expect:
    argv = compare(w, str(w.model()), "--inference", str(w.inference()), "--epochs", "0")
    return Expect(argv, ("--epochs",))


@case("compare: missing inference spec on the command line")
def _(w: Workspace) -> Expect:
    missing = w.root / "nope.toml"
    argv = compare(w, str(w.model()), "--inference", str(missing))
    return Expect(argv, (str(missing),))


def compare_run(w: Workspace) -> tuple[Path, Path]:
    """A preset and the folder ``compare`` keeps its run in."""
    from probtrans.runs.compare import run_dir
    from probtrans.specs import Method

    folder = w.fitted_run("fitted")  # a complete run that compare reuses: the preset's
    kept = load_checkpoint(folder / "checkpoint.pt")  # specs are the texts it was trained from
    model = w.write("model.toml", kept["model_spec"])
    inference = w.write("inference.toml", kept["inference_spec"])
    path = preset(w, model=model, inference=inference)
    method = Method(name="MAP", model=str(model), inference=str(inference))
    target = run_dir(w.root / "cmp", method, 0)
    target.parent.mkdir(parents=True)
    return path, Path(shutil.move(folder, target))


@case("run: compare over a run whose metrics.json is corrupt")
def _(w: Workspace) -> Expect:
    path, folder = compare_run(w)
    (folder / "metrics.json").write_text("{not json")
    (folder / "probs.npz").write_bytes(b"")
    return Expect(compare(w, "--preset", str(path)), (str(folder / "metrics.json"),))


@case("run: compare over a run whose probs.npz is corrupt")
def _(w: Workspace) -> Expect:
    path, folder = compare_run(w)
    (folder / "metrics.json").write_text('{"epochs": 1, "seed": 0}\n')
    (folder / "probs.npz").write_bytes(b"PK\x03\x04 truncated")
    return Expect(compare(w, "--preset", str(path)), (str(folder / "probs.npz"),))


@case("run: compare over a run whose metrics.json and probs.npz come from two evaluations")
def _(w: Workspace) -> Expect:
    path, folder = compare_run(w)
    metrics = json.loads((folder / "metrics.json").read_text())
    (folder / "metrics.json").write_text(json.dumps({**metrics, "posterior_samples": 20}))
    return Expect(compare(w, "--preset", str(path)), (str(folder), "come from two evaluations"))


@case("compare: --out a folder of the user's holding its own table.md")
def _(w: Workspace) -> Expect:
    notes = w.root / "cmp"  # where compare(w, ...) writes
    w.write("cmp/table.md", "| my | own | table |\n")
    argv = compare(w, str(w.model()), "--inference", str(w.inference()))
    return Expect(argv, (f"{notes}: not a folder probtrans compare wrote", "table.md", "--force"))


@case("compare: --out a folder of the user's holding notes and a table.md")
def _(w: Workspace) -> Expect:
    notes = w.root / "cmp"
    w.write("cmp/table.md", "| my | own | table |\n")
    w.write("cmp/keep.csv", "my own,notes\n")
    argv = compare(w, str(w.model()), "--inference", str(w.inference()))
    return Expect(argv, (f"{notes}: not a folder probtrans compare wrote", "keep.csv"))


@case("compare: a text spec and an image spec")
def _(w: Workspace) -> Expect:
    text = w.text_model()
    argv = compare(w, str(w.model()), str(text), "--inference", str(w.inference()))
    return Expect(argv, ("cannot share one table", "texts", "images"))


@case("compare: the same spec twice")
def _(w: Workspace) -> Expect:
    model = str(w.model())
    argv = compare(w, model, model, "--inference", str(w.inference()))
    return Expect(argv, ("the same method twice",))


@case("compare: a preset naming one method twice")
def _(w: Workspace) -> Expect:
    extra = PRESET.split("[[method]]")[1].replace('"MAP"', '"MAP"\nseeds = [0]')
    path = preset(w, "[[method]]" + extra.format(model=w.model(), inference=w.inference()))
    return Expect(compare(w, "--preset", str(path)), (str(path), "one name twice"))


# ====================================================================== faults of the machine
def refuse(w: Workspace, module: object, name: str, code: int, path: str | None = None) -> None:
    """``module.name`` (an ``os`` or ``tempfile`` function) raising OSError ``code``, as on a
    read-only folder."""

    def refused(*args, **kwargs):
        raise OSError(code, os.strerror(code), path or str(args[0] if args else ""))

    w.monkeypatch.setattr(module, name, refused)


@case("fit: a read-only folder (the lock)")
def _(w: Workspace) -> Expect:
    import probtrans.storage.lock

    argv = w.fit()
    refuse(w, probtrans.storage.lock.os, "open", errno.EACCES)
    return Expect(argv, ("run.lock", "permission denied"))


@case("fit: a read-only folder (a temporary file)")
def _(w: Workspace) -> Expect:
    import probtrans.storage.io

    argv = w.fit()
    refuse(w, probtrans.storage.io.tempfile, "mkstemp", errno.EROFS, str(w.root / "run.partial"))
    return Expect(argv, ("run.partial: cannot write model.toml: read-only file system",))


@case("evaluate: a read-only run folder")
def _(w: Workspace) -> Expect:
    import probtrans.storage.io

    run = w.fitted_run()
    refuse(w, probtrans.storage.io.tempfile, "mkstemp", errno.EROFS)
    return Expect(["evaluate", str(run), "--quiet"], (str(run), "read-only file system"))


@case("fit: the disk fills up")
def _(w: Workspace) -> Expect:
    import probtrans.storage.io

    argv = w.fit()
    real = probtrans.storage.io.atomic_write

    def no_space(tmp: Path) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def full(path, write):
        return real(path, no_space if Path(path).name == "checkpoint.pt" else write)

    w.monkeypatch.setattr(probtrans.storage.io, "atomic_write", full)
    return Expect(argv, ("no space left on device", "nothing was kept"))


@case("run: predict with a probs.npz without its validation entry")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    with np.load(run / "probs.npz") as probs:
        kept = {k: probs[k] for k in probs.files if k != "plain/val"}
    np.savez(run / "probs.npz", **kept)
    inputs = w.write("inputs.npz", b"")
    np.savez(inputs, x=np.zeros((2, 8, 8), dtype=np.float32))
    argv = ["predict", str(run), str(inputs), "--quiet"]
    return Expect(argv, (str(run / "probs.npz"), "no entry plain/val"))


@case("run: evaluate with a history.json holding an object")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    (run / "history.json").write_text('{"epoch": 1}\n')
    return Expect(["evaluate", str(run), "--quiet"], (str(run / "history.json"), "an object"))


@case("run: predict with a probs.npz that is a text file")
def _(w: Workspace) -> Expect:
    run = w.fitted_run()
    (run / "probs.npz").write_text("not arrays at all\n")
    inputs = w.write("inputs.npz", b"")
    np.savez(inputs, x=np.zeros((2, 8, 8), dtype=np.float32))
    argv = ["predict", str(run), str(inputs), "--quiet"]
    return Expect(argv, (str(run / "probs.npz"), "a text file?"), absent=("pickle",))


# ====================================================================== describe
@case("describe: missing spec")
def _(w: Workspace) -> Expect:
    missing = w.root / "nope.toml"
    return Expect(["describe", str(missing)], (str(missing), "no such file"))


@case("describe: unknown key")
def _(w: Workspace) -> Expect:
    model = w.model("[model.decoder]\nlayers = 2\n")
    return Expect(["describe", str(model)], (str(model), "model.decoder"))


@case("describe: patch_size does not divide 8x8")
def _(w: Workspace) -> Expect:
    model = w.write("model.toml", _model_with("data", patch_size="3"))
    return Expect(["describe", str(model)], (str(model), "data.patch_size = 3"))


@case("describe: ood_classes out of range")
def _(w: Workspace) -> Expect:
    model = w.write("model.toml", _model_with("data", ood_classes="[4, 12]"))
    return Expect(["describe", str(model)], (str(model), "data.ood_classes"))


# ====================================================================== corrections
def corrections(w: Workspace, spec: Path | None = None, *args: str) -> list[str]:
    spec = spec or w.segmentation()
    return ["corrections", str(spec), "--out", str(w.root / "corr"), *args]


@case("corrections: missing spec")
def _(w: Workspace) -> Expect:
    missing = w.root / "nope.toml"
    return Expect(corrections(w, missing), (str(missing), "no such file"))


@case("corrections: even window")
def _(w: Workspace) -> Expect:
    spec = w.segmentation("[model.attention]\nkind = 'gaussian_mixture'\n")
    spec.write_text(spec.read_text().replace("d_key = 4", "d_key = 4\nwindow = 4"))
    return Expect(corrections(w, spec), (str(spec), "model.window = 4"))


@case("corrections: heads do not divide the width")
def _(w: Workspace) -> Expect:
    spec = w.segmentation()
    spec.write_text(spec.read_text().replace("n_heads = 2", "n_heads = 3"))
    return Expect(corrections(w, spec), (str(spec), "model.n_heads = 3"))


@case("corrections: theta_beta2 without theta_beta1")
def _(w: Workspace) -> Expect:
    spec = w.segmentation("theta_beta2 = 1.0\n")
    return Expect(corrections(w, spec), (str(spec), "corrections.theta_beta2"))


@case("corrections: --ks a,b")
def _(w: Workspace) -> Expect:
    return Expect(corrections(w, None, "--ks", "a,b"), ("--ks",))


@case("corrections: --ks empty")
def _(w: Workspace) -> Expect:
    return Expect(corrections(w, None, "--ks", ""), ("--ks",))


@case("corrections: --ks 0,99")
def _(w: Workspace) -> Expect:
    return Expect(corrections(w, None, "--ks", "0,99"), ("--ks",))


@case("corrections: --ks 1,1")
def _(w: Workspace) -> Expect:
    return Expect(corrections(w, None, "--ks", "1,1"), ("--ks",))


@case("corrections: --n-test 0")
def _(w: Workspace) -> Expect:
    return Expect(corrections(w, None, "--n-test", "0"), ("--n-test",))


@case("corrections: --seed -1")
def _(w: Workspace) -> Expect:
    return Expect(corrections(w, None, "--seed", "-1"), ("--seed",))


@case("corrections: --out an existing file")
def _(w: Workspace) -> Expect:
    blocking = w.write("corr", "a file of the user's\n")
    return Expect(corrections(w), (f"--out {blocking}", "is a file"))


# ====================================================================== text data
@case("data: cola with an empty data folder")
def _(w: Workspace) -> Expect:
    w.data_dir({})
    return Expect(["describe", str(w.text_model())], ("cola/raw/in_domain_train.tsv",))


@case("data: imdb with an empty data folder")
def _(w: Workspace) -> Expect:
    w.data_dir({})
    return Expect(["describe", str(w.text_model("imdb"))], ("imdb/train.jsonl.gz",))


@case("data: cola without its dev file")
def _(w: Workspace) -> Expect:
    files = good_cola()
    del files["cola/raw/in_domain_dev.tsv"]
    w.data_dir(files)
    return Expect(["describe", str(w.text_model())], ("cola/raw/in_domain_dev.tsv",))


def malformed_cola(name: str, content: bytes, *names: str, command: str = "describe") -> None:
    """CoLA's training file replaced by ``content``: the file (and line) named."""

    @case(f"data: cola {name}" + (f" ({command})" if command != "describe" else ""))
    def build(w: Workspace) -> Expect:
        root = w.data_dir({**good_cola(), "cola/raw/in_domain_train.tsv": content})
        path = str(root / "cola/raw/in_domain_train.tsv")
        if command == "fit":
            return Expect(w.fit(w.text_model()), tuple(n.format(path=path) for n in names))
        argv = ["describe", str(w.text_model())]
        return Expect(argv, tuple(n.format(path=path) for n in names))


malformed_cola("label not an integer", cola_rows(3) + b"src\tx\t\ta sentence\n", "{path}:4")
malformed_cola("label out of range", b"src\t5\t\ta sentence\n" + cola_rows(3), "{path}:1")
malformed_cola("missing text column", cola_rows(2) + b"src\t1\n", "{path}:3", "'sentence' is")
malformed_cola("bytes not UTF-8", cola_rows(2) + b"src\t1\t\tcaf\xe9\n", "{path}:3", "UTF-8")
malformed_cola("empty file", b"", "{path}", "no rows")
malformed_cola("many bad rows", b"src\tx\t\ta\n" * 9, "{path}:1", "more malformed rows")
malformed_cola("label not an integer", b"src\tx\t\ta\n" + cola_rows(3), "{path}:1", command="fit")


@case("data: imdb training file that is not gzip")
def _(w: Workspace) -> Expect:
    root = w.data_dir({"imdb/train.jsonl.gz": b'{"text": "plain", "label": 1}\n'})
    return Expect(["describe", str(w.text_model("imdb"))], (str(root / "imdb/train.jsonl.gz"),))


@case("data: imdb training file truncated")
def _(w: Workspace) -> Expect:
    root = w.data_dir({"imdb/train.jsonl.gz": imdb_rows(200)[:-30]})
    return Expect(["describe", str(w.text_model("imdb"))], (str(root / "imdb/train.jsonl.gz"),))


@case("data: imdb row that is not JSON")
def _(w: Workspace) -> Expect:
    root = w.data_dir({"imdb/train.jsonl.gz": gzip.compress(b'{"text": "a", "label": 1}\n{oops\n')})
    path = root / "imdb/train.jsonl.gz"
    return Expect(["describe", str(w.text_model("imdb"))], (f"{path}:2", "not a JSON object"))


@case("data: CR file whose header lacks a column")
def _(w: Workspace) -> Expect:
    root = w.data_dir(
        {
            "imdb/train.jsonl.gz": imdb_rows(),
            "imdb/test.jsonl.gz": imdb_rows(),
            "cr/tsv/test.tsv": b"sentence\tlabel\ngood phone\t1\n",
        }
    )
    path = root / "cr/tsv/test.tsv"
    return Expect(["describe", str(w.text_model("imdb"))], (f"{path}: no text column 'text'",))


# ====================================================================== own data files
OWN_TEXT_MODEL = (
    """
[data]
kind = "text"
train = "{train}"
max_len = 16

"""
    + "[model]"
    + TINY_MODEL.split("[model]", 1)[1]
)


def own_rows(n: int = 20, header: bytes = b"text,label\n") -> bytes:
    """A CSV of ``n`` well-formed rows (text, label: neg or pos)."""
    rows = (f"text number {i} here,{'pos' if i % 2 else 'neg'}\n" for i in range(n))
    return header + "".join(rows).encode()


def own_data_case(name: str, file: str, content: bytes, *names: str, **expect) -> None:
    """``fit`` of a text model whose training file ``file`` holds ``content``: the file (and
    line: ``{path}``) and ``names``."""

    @case(f"data: {name}")
    def build(w: Workspace) -> Expect:
        path = w.write(file, content)
        model = w.write("own.toml", OWN_TEXT_MODEL.format(train=file))
        return Expect(w.fit(model), tuple(n.format(path=path) for n in names), **expect)


own_data_case(
    "CSV row whose label is NaN",
    "train.csv",
    own_rows() + b"one more text,NaN\n",
    "{path}:22",
    "'NaN', a missing value",
)
own_data_case(
    "CSV row whose label is N/A",
    "train.csv",
    own_rows() + b"one more text, N/A\n",
    "{path}:22",
    "missing value",
)
own_data_case(
    "CSV row with an empty label",
    "train.csv",
    own_rows() + b"one more text,\n",
    "{path}:22",
    "'label' is missing",
)
own_data_case(
    "JSON Lines row with a null label",
    "train.jsonl",
    b'{"text": "a text", "label": "pos"}\n{"text": "another", "label": "neg"}\n'
    b'{"text": "no label", "label": null}\n',
    "{path}:3",
    "'label' is missing",
)
own_data_case(
    "CSV too small to split off the test and validation rows",
    "train.csv",
    own_rows(3),
    "data: train.csv: cannot split test (test_fraction = 0.2) off train (3 rows)",
)
_CONTROL = bytes(b for b in range(1, 32) if b not in b"\n\r,")  # UTF-8, yet not text
own_data_case(
    "CSV whose header is 4 KB of binary",
    "train.csv",
    own_rows(header=bytes(_CONTROL[i % len(_CONTROL)] for i in range(4096)) + b"\n"),
    "{path}",
    "no text column",
    max_chars=300,
)


own_data_case(
    "CSV row with a quote left open, run on into the following lines",
    "train.csv",
    own_rows(5) + b'"a quote left open,pos\n' + own_rows(3, header=b"") + b'"quoted",neg\n',
    "{path}:7",
    "quote left open",
    "runs on to line 11",
)
own_data_case(
    "CSV row with a quote left open to the end of the file",
    "train.csv",
    own_rows(5) + b'"a quote left open,pos\n' + own_rows(3, header=b""),
    "{path}:7",
    "not a valid CSV row",
)


@case("data: data file in a model spec that is a folder")
def _(w: Workspace) -> Expect:
    folder = w.root / "train.csv"
    folder.mkdir()
    model = w.write("own.toml", OWN_TEXT_MODEL.format(train="train.csv"))
    return Expect(w.fit(model), (str(folder), "is a folder, not a file"))


# ====================================================================== run data files
def _edit_data_json(run: Path, edit: Callable[[dict], object]) -> Path:
    """``run``'s data.json replaced by ``edit(its value)``."""
    path = run / "data.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    return path


def _without(key: str) -> Callable[[dict], dict]:
    return lambda info: {k: v for k, v in info.items() if k != key}


def run_data_case(name: str, edit: Callable[[dict], object], *names: str) -> None:
    """``predict`` and ``evaluate`` of the image run whose data.json is ``edit``ed."""

    @case(f"run: predict with data.json {name}")
    def predict(w: Workspace) -> Expect:
        path = _edit_data_json(w.fitted_run(), edit)
        inputs = w.write("inputs.txt", "a text\n")
        return Expect(["predict", str(path.parent), str(inputs), "--quiet"], (str(path), *names))

    @case(f"run: evaluate with data.json {name}")
    def evaluate(w: Workspace) -> Expect:
        path = _edit_data_json(w.fitted_run(), edit)
        return Expect(["evaluate", str(path.parent), "--quiet"], (str(path), *names))


run_data_case("holding {}", lambda info: {}, "missing")
run_data_case("holding a list", lambda info: [info], "a list, not an object")
run_data_case("without scaling", _without("scaling"), "scaling: missing")
run_data_case("without class_names", _without("class_names"), "class_names: missing")
run_data_case("with class_names a string", lambda info: info | {"class_names": "ab"}, "class_names")
run_data_case("with a text kind", lambda info: info | {"kind": "texts"}, "kind = 'texts'")


def tokenizer_case(name: str, damage: Callable[[bytes], bytes], *names: str) -> None:
    """``predict`` and ``evaluate`` of the text run whose tokenizer.json is ``damage``d."""

    def damaged(w: Workspace) -> Path:
        path = w.fitted_text_run() / "tokenizer.json"
        path.write_bytes(damage(path.read_bytes()))
        return path

    @case(f"run: predict with a tokenizer.json {name}")
    def predict(w: Workspace) -> Expect:
        path = damaged(w)
        inputs = w.write("inputs.txt", "a text\n")
        return Expect(["predict", str(path.parent), str(inputs), "--quiet"], (str(path), *names))

    @case(f"run: evaluate with a tokenizer.json {name}")
    def evaluate(w: Workspace) -> Expect:
        path = damaged(w)
        return Expect(["evaluate", str(path.parent), "--quiet"], (str(path), *names))


tokenizer_case("truncated", lambda content: content[: len(content) // 2], "damaged tokenizer")
tokenizer_case(
    "of another kind", lambda _: b'{"version": "1.0", "model": {"kind": 1}}', "damaged tokenizer"
)
tokenizer_case("holding a list", lambda _: b"[]", "damaged tokenizer")


@case("run: evaluate with a tokenizer.json of another vocabulary")
def _(w: Workspace) -> Expect:
    from tokenizers import Tokenizer

    path = w.fitted_text_run() / "tokenizer.json"
    other = json.loads(path.read_text())
    other["model"]["vocab"]["an extra word"] = len(other["model"]["vocab"])
    path.write_text(Tokenizer.from_str(json.dumps(other)).to_str())
    return Expect(["evaluate", str(path.parent), "--quiet"], (str(path), "not the run's tokenizer"))


# ====================================================================== caches
def cache_file(w: Workspace, model: Path) -> Path:
    """Where the tokenised bundle of ``model``'s data goes (after ``data_dir``)."""
    from probtrans.data.text import TASK_SOURCES
    from probtrans.data.text_bundle import cache_key
    from probtrans.resolve import load_model_spec

    spec = load_model_spec(model).data
    return w.cache / f"{spec.name}-{spec.protocol}-{cache_key(spec, TASK_SOURCES[spec.name])}.pt"


@case("cache: PROBTRANS_CACHE_DIR is a file")
def _(w: Workspace) -> Expect:
    w.data_dir(good_cola())
    blocker = w.write("cache-file", "not a folder")
    w.monkeypatch.setenv("PROBTRANS_CACHE_DIR", str(blocker))
    return Expect(["describe", str(w.text_model())], (str(blocker),))


# ====================================================================== pretrained backbones
def backbone_case(name: str, extra: str, *names: str, **data: str) -> None:
    """``fit`` of the tiny BERT on texts, its spec with ``extra`` (and ``data`` in ``[data]``):
    the file and ``names``."""

    @case(f"spec/model: backbone {name}")
    def build(w: Workspace) -> Expect:
        model = w.backbone_model(extra, **data)
        return Expect(w.fit(model), (str(model), *names))


@case("spec/model: backbone hub id not in the cache, offline")
def _(w: Workspace) -> Expect:
    home = w.root / "hf-home"  # an empty Hugging Face home: nothing cached
    home.mkdir()
    w.monkeypatch.setenv("HF_HOME", str(home))
    model = w.backbone_model(backbone="hf:no-such-org/no-such-model")
    names = (str(model), "model.backbone = 'hf:no-such-org/no-such-model'", "needs a network")
    return Expect(w.fit(model), (*names, "or a local folder"), max_seconds=10)


@case("describe: backbone hub id not in the cache, offline")
def _(w: Workspace) -> Expect:
    model = w.backbone_model(backbone="hf:no-such-org/no-such-model")
    names = (str(model), "model.backbone", "needs a network or a local folder")
    return Expect(["describe", str(model)], names, max_seconds=10)


@case("spec/model: backbone hub id empty")
def _(w: Workspace) -> Expect:
    model = w.backbone_model(backbone="hf:")
    return Expect(w.fit(model), (str(model), "model.backbone = 'hf:'", "give the hub id"))


@case("spec/model: backbone hub id malformed")
def _(w: Workspace) -> Expect:
    model = w.backbone_model(backbone="hf:a//b")
    return Expect(w.fit(model), (str(model), "model.backbone = 'hf:a//b'", "not a hub id"))


@case("spec/model: backbone folder that is not a saved model")
def _(w: Workspace) -> Expect:
    w.write("weights/notes.txt", "not a model")
    model = w.backbone_model(backbone="weights")
    folder = w.root / "weights"
    return Expect(w.fit(model), (str(model), "model.backbone", str(folder), "no config.json"))


@case("spec/model: backbone weights truncated")
def _(w: Workspace) -> Expect:
    folder = w.backbone()
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:500])
    model = w.backbone_model(backbone=str(folder))
    return Expect(w.fit(model), (str(model), str(weights), "damaged weights"))


@case("spec/model: backbone config with a negative size")
def _(w: Workspace) -> Expect:
    folder = w.backbone()
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "hidden_size": -32}))
    model = w.backbone_model(backbone=str(folder))
    return Expect(w.fit(model), (str(model), str(folder / "config.json"), "no model can be built"))


@case("spec/model: backbone folder that does not exist")
def _(w: Workspace) -> Expect:
    model = w.backbone_model(backbone="gone")
    folder = w.root / "gone"
    return Expect(w.fit(model), (str(model), "model.backbone", str(folder), "no such folder"))


for field, value in [("vocab_size", "500"), ("min_freq", "3")]:
    backbone_case(
        f"{field} with its pretrained tokenizer",
        "",
        f"data.{field} = {value}",
        "does not apply to a pretrained tokenizer",
        **{field: value},
    )
backbone_case(
    "swap index out of range",
    "[model.swap]\nlayers = [5]\n",
    "model.swap.layers = [5]",
    "out of range",
    "2 self-attention blocks",
)
backbone_case(
    "swap naming one block twice", "[model.swap]\nlayers = [1, -1]\n", "model.swap.layers"
)
backbone_case(
    "swap of sgpa_standard",
    '[model.swap]\nattention = { kind = "sgpa_standard" }\n',
    "model.swap.attention.kind = 'sgpa_standard'",
    "use kind = 'sgpa'",
)
backbone_case(
    "LoRA targets matching no module",
    '[model.prior]\nweights = "lora"\nlora = { targets = ["nonexistent"] }\n',
    "model.prior.lora.targets",
    "'nonexistent' matches no linear map",
)
backbone_case(
    "max_len beyond its positions", "", "data.max_len = 100", "64 positions", max_len="100"
)
backbone_case("d_model beside it", "d_model = 128\n", "model.d_model = 128", "model.backbone")


@case("describe: backbone swap index out of range")
def _(w: Workspace) -> Expect:
    model = w.backbone_model("[model.swap]\nlayers = [5]\n")
    return Expect(["describe", str(model)], (str(model), "model.swap.layers = [5]"))


@case("spec/model: backbone without self-attention blocks of a known shape")
def _(w: Workspace) -> Expect:
    from tests.tiny_backbones import save_tiny_gpt2

    folder = save_tiny_gpt2(w.root / "gpt2")  # its attention projects with one Conv1D, c_attn
    model = w.backbone_model("[model.swap]\nlayers = [-1]\n", backbone=str(folder))
    return Expect(w.fit(model), (str(model), "model.swap", "no self-attention blocks"))


@case("spec/model: backbone that fails on the texts (X-MOD without a default language)")
def _(w: Workspace) -> Expect:
    from transformers import AutoModel, AutoTokenizer, XmodConfig, XmodModel

    from tests.tiny_backbones import TINY_SIZES

    tokenizer = AutoTokenizer.from_pretrained(w.backbone())  # the tiny BERT's
    config = XmodConfig(**TINY_SIZES, vocab_size=len(tokenizer), languages=["en_XX"])
    folder = w.root / "xmod"
    XmodModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    assert AutoModel.from_pretrained(folder).config.default_language is None
    model = w.backbone_model(backbone=str(folder))
    names = ("model.backbone", "XmodModel fails on the inputs of", "Input language unknown")
    return Expect(w.fit(model), (str(model), *names))


@case("spec/model: text_pair_column not in the file")
def _(w: Workspace) -> Expect:
    model = w.backbone_model(text_pair_column='"hypothesis"')  # train.csv: text, label
    return Expect(w.fit(model), (str(w.root / "train.csv"), "no text column 'hypothesis'"))


@case("spec/model: text pairs with a decoder's tokenizer")
def _(w: Workspace) -> Expect:
    from tests.tiny_backbones import save_tiny_gpt2

    folder = save_tiny_gpt2(w.root / "gpt2")
    rows = [f"text {i},other text {i},{'pos' if i % 2 else 'neg'}" for i in range(20)]
    w.write("pairs.csv", ("text,text2,label\n" + "\n".join(rows) + "\n").encode())
    model = w.backbone_model(backbone=str(folder), train='"pairs.csv"', text_pair_column='"text2"')
    names = ("data.text_pair_column", "no special token between a pair's two texts")
    return Expect(w.fit(model), (str(model), *names))


@case("spec/model: first-token pooling of a causal backbone")
def _(w: Workspace) -> Expect:
    from tests.tiny_backbones import save_tiny_gpt2

    folder = save_tiny_gpt2(w.root / "gpt2")
    model = w.backbone_model(backbone=str(folder))  # pooling = "cls"
    return Expect(w.fit(model), (str(model), "model.pooling = 'cls'", "causally", "'last'"))


edited_model_case(
    "last-token pooling without a backbone",
    "model",
    {"pooling": '"last"'},
    "model.pooling = 'last'",
    "needs model.backbone",
)


@case("spec/model: backbone tokenizer larger than its vocabulary")
def _(w: Workspace) -> Expect:
    from transformers import AutoModel

    from tests.tiny_backbones import tiny_config

    folder = w.backbone("bert", "tokenizer")  # a tokenizer of 60-odd tokens
    AutoModel.from_config(tiny_config("bert", vocab_size=10)).save_pretrained(w.root / "small")
    model = w.backbone_model(backbone=str(w.root / "small"), tokenizer=f'"{folder}"')
    return Expect(w.fit(model), (str(model), "data.tokenizer", "more than the 10"))


@case("spec/model: swap without a backbone")
def _(w: Workspace) -> Expect:
    model = w.model("[model.swap]\nlayers = [-1]\n")
    return Expect(w.fit(model), (str(model), "model.swap", "needs model.backbone"))


edited_model_case(
    "LoRA without a backbone",
    "model.prior",
    {"weights": '"lora"'},
    "model.prior.weights = 'lora'",
    "needs model.backbone",
)


@case("spec/model: backbone for images given texts")
def _(w: Workspace) -> Expect:
    model = w.backbone_model(backbone=str(w.backbone("vit")))
    return Expect(w.fit(model), (str(model), "model.backbone", "an image model"))


def _images(w: Workspace, shape: tuple[int, ...]) -> Path:
    """An ``.npz`` of 20 images of ``shape`` and their labels."""
    path = w.root / "images.npz"
    x = np.random.default_rng(0).random((20, *shape), dtype=np.float32)
    np.savez(path, x=x, y=np.arange(20) % 2)
    return path


@case("spec/model: backbone for images given images of another number of channels")
def _(w: Workspace) -> Expect:
    _images(w, (3, 8, 8))  # the tiny ViT takes one channel
    data = {"kind": '"image"', "train": '"images.npz"'}
    model = w.backbone_model(backbone=str(w.backbone("vit")), **data)
    return Expect(w.fit(model), (str(model), "(3, 8, 8)", "model.backbone"))


@case("spec/model: backbone for texts given images")
def _(w: Workspace) -> Expect:
    _images(w, (8, 8))
    model = w.backbone_model(kind='"image"', train='"images.npz"')
    return Expect(w.fit(model), (str(model), "model.backbone", "a text model"))


# ====================================================================== the harness
def snapshot(root: Path) -> dict[str, bytes | str]:
    """Every folder and file under ``root``: relative path → file bytes, or ``<folder>``."""
    state: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        key = path.relative_to(root).as_posix()
        if path.is_symlink():
            state[key] = f"<link to {os.readlink(path)}>"
        elif path.is_dir():
            state[key] = "<folder>"
        else:
            state[key] = path.read_bytes()
    return state


def disk_changes(before: dict, after: dict) -> list[str]:
    created = sorted(after.keys() - before.keys())
    removed = sorted(before.keys() - after.keys())
    changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    return (
        [f"created {created}"] * bool(created)
        + [f"removed {removed}"] * bool(removed)
        + [f"changed {changed}"] * bool(changed)
    )


@pytest.fixture(scope="module")
def fitted_run(tmp_path_factory) -> Path:
    """A real run folder: the tiny model, one epoch."""
    from probtrans.runs import fit

    root = tmp_path_factory.mktemp("fitted")
    model = root / "model.toml"
    model.write_text(TINY_MODEL)
    fit(model, tiny_inference(root, "map"), out=root / "run", epochs=1, progress=False)
    return root / "run"


@pytest.fixture(scope="module")
def fitted_text_run(tmp_path_factory) -> Path:
    """A real run folder on a small CSV of texts: the tiny model, one epoch."""
    from probtrans.runs import fit

    root = tmp_path_factory.mktemp("fitted-text")
    (root / "train.csv").write_bytes(own_rows(40))
    model = root / "model.toml"
    model.write_text(OWN_TEXT_MODEL.format(train="train.csv"))
    fit(model, tiny_inference(root, "map"), out=root / "run", epochs=1, progress=False)
    return root / "run"


@pytest.fixture(scope="module")
def tiny_backbones(tmp_path_factory) -> Path:
    """Tiny pretrained-style models (random weights) saved with ``save_pretrained``: ``bert``
    (with its tokenizer) and ``vit`` (8×8 images, one channel)."""
    from tests.tiny_backbones import save_tiny_backbone

    root = tmp_path_factory.mktemp("backbones")
    for family in ("bert", "vit"):
        save_tiny_backbone(family, root / family)
    return root


def test_there_are_enough_cases():
    assert len(CASES) + len(ARGPARSE_CASES) >= 60
    assert {name.split(":")[0].split("/")[0] for name in CASES} >= {
        "spec",
        "fit",
        "evaluate",
        "compare",
        "describe",
        "corrections",
        "data",
        "cache",
        "run",
    }


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_error_line_and_changes_nothing(
    name, tmp_path, monkeypatch, capsys, request
):
    w = Workspace(tmp_path, monkeypatch, request)
    expect = CASES[name](w)
    before = snapshot(tmp_path)
    capsys.readouterr()
    start = time.perf_counter()
    status = main(expect.argv)
    seconds = time.perf_counter() - start
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    problems = []
    if status != 2:
        problems.append(f"exit status {status}, not 2")
    if len(lines) != 1 or not lines[0].startswith("error: "):
        problems.append(f"stderr is not one 'error: ' line: {err!r}")
    else:
        problems += [f"{n!r} not named" for n in expect.names if n and n not in lines[0]]
        problems += [f"{a!r} in the message" for a in expect.absent if a in lines[0]]
    if w.marker.exists():
        problems.append("code pickled in a checkpoint ran")
    if expect.max_chars is not None and len(err.strip()) > expect.max_chars:
        problems.append(f"an error line of {len(err.strip())} characters")
    if expect.max_seconds is not None and seconds > expect.max_seconds:
        problems.append(f"{seconds:.1f} s, more than {expect.max_seconds} s")
    problems += disk_changes(before, snapshot(tmp_path))
    assert not problems, "\n".join([*problems, f"stderr: {err}"])


# ====================================================================== argparse
ARGPARSE_CASES = {
    "schema: unknown kind": (["schema", "widget"], "argument kind: invalid choice: 'widget'"),
    "schema: no kind": (["schema"], "the following arguments are required: kind"),
    "no command": ([], "the following arguments are required: command"),
    "unknown command": (["train"], "invalid choice: 'train'"),
    "fit: --epochs abc": (["fit", "--epochs", "abc"], "argument --epochs: invalid int value"),
    "fit: --seed 1.5": (["fit", "--seed", "1.5"], "argument --seed: invalid int value"),
    "evaluate: no run folder": (["evaluate"], "the following arguments are required: run_dir"),
    "compare: no --out": (["compare", "--preset", "p.toml"], "arguments are required: --out"),
    "compare: --ood-score nope": (
        ["compare", "--preset", "p.toml", "--out", "o", "--ood-score", "nope"],
        "argument --ood-score: invalid choice: 'nope'",
    ),
    "corrections: --n-test x": (["corrections", "--n-test", "x"], "argument --n-test"),
    "describe: two specs": (["describe", "a.toml", "b.toml"], "unrecognized arguments: b.toml"),
}


@pytest.mark.parametrize("name", list(ARGPARSE_CASES))
def test_argparse_errors_exit_2_with_usage(name, tmp_path, monkeypatch, capsys, request):
    w = Workspace(tmp_path, monkeypatch, request)
    argv, message = ARGPARSE_CASES[name]
    before = snapshot(tmp_path)
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_info.value.code == 2, err
    assert lines[0].startswith("usage: probtrans"), err
    assert lines[-1].startswith("probtrans") and ": error: " in lines[-1], err
    assert message in lines[-1], err
    assert not disk_changes(before, snapshot(w.root))
