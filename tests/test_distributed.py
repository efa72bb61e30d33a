"""Data-parallel training on torch.distributed: 2 processes on CPU (gloo, loopback only) follow
the path of one process, train a stochastic model into one complete run folder, and resume after
a kill; the pieces that need no process group are checked in this process."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

from probtrans.classifier import build_classifier
from probtrans.cli import main
from probtrans.errors import ProbtransError
from probtrans.inference.train import SVITraining
from probtrans.resolve import load_inference_spec
from probtrans.runs.kept import read_probs
from probtrans.runtime.distributed import Processes, process_group
from probtrans.specs import updated
from probtrans.storage.checkpoint import load_checkpoint
from tests.conftest import ROOT, TINY_MODEL, inference_file, tiny_spec

#: the deterministic digits model of (a): softmax attention, no dropout
SOFTMAX_MODEL = TINY_MODEL.replace(
    'kind = "h_sto"\ntau1 = 1.0\ntau2 = 2.0\nn_centroids = 3', 'kind = "softmax"'
)
#: 865 training rows in batches of 27: parts of 14 and 13 rows, and a last batch of one row,
#: which leaves rank 1 with nothing (its loss then weighs 0)
MAP_27 = """
[guide]
name = "delta"

[optim]
lr = 5e-3

[train]
epochs = 2
batch_size = 27
val_samples = 1

[predictive]
samples = 2
"""
NORMAL = """
[guide]
name = "normal"

[optim]
lr = 5e-3

[train]
epochs = 3
batch_size = 32
val_samples = 2

[predictive]
samples = 3
"""
#: a process that SIGKILLs itself right after rank 0 saved the resume state of epoch 2
KILLED_AFTER_EPOCH_2 = textwrap.dedent(
    """
    import os, signal, sys
    import probtrans.inference.train as train
    from probtrans.cli import main

    save = train.Resumable.save
    def dying_save(self, state):
        save(self, state)
        if state["epoch"] == 2:
            os.kill(os.getpid(), signal.SIGKILL)
    train.Resumable.save = dying_save
    sys.exit(main(sys.argv[1:]))
    """
)


#: the files of a finished run folder
RUN_FOLDER = {
    "checkpoint.pt",
    "data.json",
    "data.pt",
    "feature_scores.npz",
    "history.csv",
    "history.json",
    "inference.toml",
    "metrics.json",
    "model.toml",
    "predictive.nc",
    "probs.npz",
    "report.png",
    "timing.json",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(*command: str, processes: int = 2) -> subprocess.CompletedProcess:
    """``torchrun --nproc_per_node N`` of ``command`` (a script and its arguments, or ``-m
    probtrans ...``) on this machine's loopback interface, at most 5 minutes."""
    env = {**os.environ, "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
    launcher += ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    return subprocess.run(
        [*launcher, *command], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )


def fit_command(model: Path, inference: Path, out: Path) -> list[str]:
    return ["fit", str(model), "--inference", str(inference), "--out", str(out), "--quiet"]


def weights(folder: Path) -> dict[str, torch.Tensor]:
    state = load_checkpoint(folder / "checkpoint.pt")
    return {**state["model_state"], **state["guide_state"]}


def test_two_processes_with_half_batches_follow_one_process_with_the_whole_batch(tmp_path):
    """(a) A deterministic model (softmax attention, delta guide, dropout 0): 2 ranks × parts of
    a 27-row batch end 66 Adam steps where 1 process with 27-row batches does, to 1e-5.

    The key bias is left out of the comparison: softmax attention is invariant to it, so its
    gradient is zero up to rounding, and Adam, which divides by the gradient's scale, turns that
    rounding noise into full-size steps that differ with any change in summation order (also
    between two batch sizes in one process). The logits it cannot change are compared instead."""
    model = tmp_path / "softmax.toml"
    model.write_text(SOFTMAX_MODEL)
    inference = inference_file(tmp_path, "map27.toml", MAP_27)
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(fit_command(model, inference, one)) == 0
    child = torchrun("-m", "probtrans", *fit_command(model, inference, two))
    assert child.returncode == 0, child.stderr

    single, parallel = weights(one), weights(two)
    key_bias = slice(16, 32)  # qkv.bias holds the query, key and value biases of width 16
    for name, value in single.items():
        if name.endswith("attn.qkv.bias"):
            value, parallel[name] = value.clone(), parallel[name].clone()
            value[key_bias] = parallel[name][key_bias] = 0
        torch.testing.assert_close(parallel[name], value, rtol=0, atol=1e-5, msg=name)
    history = [json.loads((f / "history.json").read_text()) for f in (one, two)]
    assert len(history[0]) == len(history[1]) == 2
    for a, b in zip(*history, strict=True):
        assert a["elbo"] == pytest.approx(b["elbo"], rel=1e-6)
        assert a["val_nll"] == pytest.approx(b["val_nll"], rel=1e-5)
    single_probs, parallel_probs = (read_probs(f / "probs.npz").probs["plain"] for f in (one, two))
    for split, value in single_probs.items():  # the network's outputs, key bias included
        np.testing.assert_allclose(parallel_probs[split], value, rtol=0, atol=1e-5, err_msg=split)


def test_two_processes_train_a_stochastic_model_into_one_run_folder_and_resume_after_a_kill(
    tmp_path,
):
    """(b) H-STO with the normal guide on 2 processes writes one complete run folder, with every
    process exiting 0; (c) the same fit with a process killed right after epoch 2's resume state
    was saved stops, and the same command continues it to the files of the uninterrupted fit."""
    model = tmp_path / "h_sto.toml"
    model.write_text(TINY_MODEL.replace("dropout = 0.0", "dropout = 0.1"))
    inference = inference_file(tmp_path, "normal.toml", NORMAL)
    straight = tmp_path / "straight"
    child = torchrun("-m", "probtrans", *fit_command(model, inference, straight))
    assert child.returncode == 0, child.stderr
    assert "run written to" in child.stdout and child.stdout.count("metric ") == 1  # rank 0 only
    assert {p.name for p in straight.iterdir()} == RUN_FOLDER
    metrics = json.loads((straight / "metrics.json").read_text())
    assert metrics["epochs"] == 3 and 0 < metrics["accuracy"] <= 1
    assert len(json.loads((straight / "history.json").read_text())) == 3

    killed = tmp_path / "killed"
    script = tmp_path / "killed_after_epoch_2.py"
    script.write_text(KILLED_AFTER_EPOCH_2)
    child = torchrun(str(script), *fit_command(model, inference, killed))
    assert child.returncode != 0 and not killed.exists()
    staging = tmp_path / "killed.partial"
    state = load_checkpoint(staging / "resume.pt")
    assert state["epoch"] == 2 and len(state["rng"]) == 2  # one random state per process

    again = torchrun("-m", "probtrans", *fit_command(model, inference, killed))
    assert again.returncode == 0, again.stderr
    assert "took over the stale lock" in again.stderr and not staging.exists()
    assert {p.name for p in killed.iterdir()} == RUN_FOLDER
    for name in ("history.json", "metrics.json", "probs.npz"):
        assert (killed / name).read_bytes() == (straight / name).read_bytes(), name
    for name, value in weights(straight).items():
        torch.testing.assert_close(weights(killed)[name], value, rtol=0, atol=0)


def test_compare_on_two_processes_trains_each_run_once_and_writes_the_table_once(tmp_path):
    model = tmp_path / "softmax.toml"
    model.write_text(SOFTMAX_MODEL)
    inference = inference_file(tmp_path, "map27.toml", MAP_27)
    command = ["-m", "probtrans", "compare", str(model), "--inference", str(inference)]
    command += ["--out", str(tmp_path / "cmp"), "--epochs", "1", "--quiet"]
    child = torchrun(*command)
    assert child.returncode == 0, child.stderr
    lines = child.stdout.splitlines()  # rank 0's alone
    assert sum(line.startswith("fit ") for line in lines) == 1
    assert sum("softmax + map27 |" in line for line in lines) == 1
    assert {p.name for p in (tmp_path / "cmp").iterdir()} == {
        "runs",
        "table.md",
        "table.csv",
        "figure.png",
        "comparison.json",
    }
    (run,) = (tmp_path / "cmp" / "runs").iterdir()
    assert {p.name for p in run.iterdir()} == RUN_FOLDER

    again = torchrun(*command)  # every process agrees that the run is finished
    assert again.returncode == 0, again.stderr
    lines = again.stdout.splitlines()
    assert not any(line.startswith("fit ") for line in lines)
    assert sum("softmax + map27 |" in line for line in lines) == 1


# ---------------------------------------------------------------- without a process group
def test_each_process_takes_every_nth_row_of_a_global_batch():
    index = torch.arange(27)
    parts = [Processes(rank, 4).shard(index) for rank in range(4)]
    assert sorted(torch.cat(parts).tolist()) == list(range(27))  # disjoint, complete
    assert [len(p) for p in parts] == [7, 7, 7, 6]
    assert parts[1].tolist() == [1, 5, 9, 13, 17, 21, 25]
    assert Processes().shard(index).tolist() == index.tolist()


def test_one_process_shares_and_gathers_its_own_values():
    one = Processes()
    assert one.is_main and not one.distributed
    assert one.share(lambda: {"a": 1}) == {"a": 1} and one.gather(3) == [3]
    total = torch.tensor([1.0, 2.0])
    assert one.sum(total).tolist() == [1.0, 2.0] and one.sum(total) is not total
    with pytest.raises(ProbtransError, match="bad"):
        one.share(lambda: (_ for _ in ()).throw(ProbtransError("bad")))


def as_started_by_torchrun(monkeypatch, rank: int, size: int, port: int) -> None:
    """The variables torchrun gives process ``rank`` of ``size`` on one machine."""
    variables = {"RANK": rank, "WORLD_SIZE": size, "LOCAL_RANK": rank, "MASTER_PORT": port}
    for name, value in {**variables, "MASTER_ADDR": "127.0.0.1"}.items():
        monkeypatch.setenv(name, str(value))


@pytest.mark.parametrize("fails", [False, True])
def test_a_process_leaves_its_group_after_a_barrier_unless_its_block_failed(monkeypatch, fails):
    """A one-process gloo group as torchrun would start it: on the way out the process waits at
    a barrier (so gloo's threads have retired the last collective step before Python shuts
    down), then destroys the group; after a failure it skips the barrier, which the other
    processes may never reach, and still destroys the group."""
    as_started_by_torchrun(monkeypatch, rank=0, size=1, port=free_port())
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "lo")
    calls = []

    def spied(name: str):
        real = getattr(torch.distributed, name)

        def call(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)

        return call

    for name in ("barrier", "destroy_process_group"):
        monkeypatch.setattr(torch.distributed, name, spied(name))
    with contextlib.suppress(RuntimeError), process_group("cpu") as processes:
        assert torch.distributed.is_initialized() and processes == Processes(0, 1)
        if fails:
            raise RuntimeError("the block failed")
    assert calls == (["destroy_process_group"] if fails else ["barrier", "destroy_process_group"])
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize("gpus", [2, 1])
def test_a_cuda_process_joins_nccl_bound_to_the_gpu_of_its_local_rank(monkeypatch, gpus):
    """Torchrun's second process on a machine: with two GPUs it takes GPU 1 and binds the nccl
    group to it (its barriers then need not guess the device from the rank); with one GPU it
    stops with a message naming LOCAL_RANK before joining any group. CUDA is simulated, so this
    runs without a GPU; `pytest --device cuda` on a GPU runs the real thing."""
    as_started_by_torchrun(monkeypatch, rank=1, size=2, port=29500)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: gpus)
    calls = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: calls.append(("set_device", index)))

    def init(backend, **options):
        calls.append((backend, options["device_id"]))
        raise RuntimeError("no group is formed in this test")

    monkeypatch.setattr(torch.distributed, "init_process_group", init)
    if gpus == 1:
        with pytest.raises(ProbtransError, match="LOCAL_RANK 1: this machine has 1 CUDA devices"):
            with process_group("cuda"):
                pass
        assert calls == []
    else:
        with pytest.raises(RuntimeError, match="no group is formed"), process_group("cuda"):
            pass
        assert calls == [("set_device", 1), ("nccl", torch.device("cuda", 1))]


def training(digits, **train) -> tuple:
    spec = load_inference_spec(ROOT / "inference" / "map.toml")
    spec = updated(spec, {f"train.{k}": v for k, v in train.items()}, "test")
    return build_classifier(tiny_spec(prior="last_layer"), digits), digits, spec


def test_a_batch_smaller_than_the_processes_is_refused(digits):
    classifier, data, spec = training(digits, batch_size=3)
    with pytest.raises(ProbtransError, match=r"train.batch_size = 3: smaller than the 4 processes"):
        SVITraining(classifier, data, spec, 0, "cpu", processes=Processes(0, 4))


def test_a_guide_with_global_param_store_parameters_is_refused_on_several_processes(digits):
    import pyro
    import pyro.distributions as dist

    classifier, data, spec = training(digits)

    def guide(inputs, mask, labels, index=None, n_data=None):  # a hand-written guide
        for name, site in classifier.prior_sites.items():
            loc = pyro.param(f"{name}_loc", site.detach().clone())
            pyro.sample(name, dist.Delta(loc, event_dim=site.dim()))

    with pytest.raises(ProbtransError, match="global param store.*PyroModule"):
        SVITraining(classifier, data, spec, 0, "cpu", guide, processes=Processes(0, 2))


def test_commands_other_than_fit_and_compare_run_on_rank_0_alone(tiny_run):
    """Under torchrun a command that runs as one process runs on rank 0 (with a note) without
    joining a process group; the other processes exit at once with status 0, so torchrun
    reports no failure and prints no traceback of its own."""
    before = (tiny_run / "metrics.json").read_bytes()
    child = torchrun("-m", "probtrans", "evaluate", str(tiny_run), "--quiet", "--samples", "3")
    assert child.returncode == 0, child.stderr
    assert child.stderr.count("probtrans evaluate runs as one process: rank 0 runs it") == 1
    assert "Traceback" not in child.stderr and "error" not in child.stderr.lower()
    assert child.stdout.count("re-evaluated") == 1
    assert (tiny_run / "metrics.json").read_bytes() != before


def test_two_processes_fit_a_pretrained_backbone_into_one_run_folder(tmp_path):
    """``torchrun --nproc_per_node 2`` (gloo) fine-tunes a tiny BERT with H-STO swapped into its
    top block and LoRA adapters under a mean-field guide, and writes one complete run folder
    that keeps the backbone's config."""
    from tests.tiny_backbones import TEXTS, save_tiny_backbone

    save_tiny_backbone("bert", tmp_path / "bert")
    rows = [(text, int(any(w in text for w in ("dull", "worst", "bad")))) for text in TEXTS]
    (tmp_path / "train.csv").write_text(
        "text,label\n" + "".join(f'"{t}",{y}\n' for t, y in rows * 8)
    )
    model = tmp_path / "bert_h_sto.toml"
    model.write_text(
        '[data]\ntrain = "train.csv"\nkind = "text"\nmax_len = 32\n\n'
        '[model]\nbackbone = "bert"\npooling = "cls"\n\n'
        '[model.swap]\nlayers = [-1]\nattention = { kind = "h_sto" }\n\n'
        '[model.prior]\nweights = "lora"\nlora = { r = 2, alpha = 4 }\n'
    )
    inference = inference_file(tmp_path, "normal.toml", NORMAL)
    out = tmp_path / "run"
    child = torchrun("-m", "probtrans", *fit_command(model, inference, out))
    assert child.returncode == 0, child.stderr
    assert RUN_FOLDER | {"backbone", "tokenizer.json"} <= {p.name for p in out.iterdir()}
    assert (out / "backbone" / "config.json").is_file()
    assert not out.with_name("run.partial").exists()
    history = json.loads((out / "history.json").read_text())
    assert all(np.isfinite(epoch["elbo"]) for epoch in history)
    state = load_checkpoint(out / "checkpoint.pt")
    sites = [name for name in state["guide_state"] if "lora_a" in name]
    assert sites, sorted(state["guide_state"])
