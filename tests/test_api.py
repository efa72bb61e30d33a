"""The Python API: ``probtrans.fit`` with any guide, ``Run.load(...)`` and what a run answers,
seeding, and Pyro's rules (nothing global changed by import)."""

from __future__ import annotations

import csv
import functools
import json
import math
import random
import re
import subprocess
import sys

import numpy as np
import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import (
    AutoDiagonalNormal,
    AutoGuideList,
    AutoLaplaceApproximation,
    AutoLowRankMultivariateNormal,
    AutoNormal,
)
from pyro.nn import PyroModule, PyroSample

import probtrans
from benchmarks.guides import hand_written, normal_weight_delta_bias
from probtrans.analysis.metrics import accuracy
from probtrans.errors import ProbtransError
from probtrans.nn import HierarchicalStochasticAttention, StochasticAttention
from probtrans.runs import Run, evaluate_run
from probtrans.specs import read_inference_spec, read_model_spec
from tests.conftest import ROOT, TINY_MODEL, tiny_inference

# --- Pyro's rules -------------------------------------------------------------------------

TUTORIAL = """
import pyro, torch, pyro.distributions as dist
from pyro.infer import SVI, Trace_ELBO
from pyro.infer.autoguide import AutoDiagonalNormal
from pyro.nn import PyroModule, PyroSample
{prelude}

class Regression(PyroModule):
    def __init__(self):
        super().__init__()
        self.linear = PyroModule[torch.nn.Linear](3, 1)
        self.linear.weight = PyroSample(dist.Normal(0.0, 1.0).expand([1, 3]).to_event(2))

    def forward(self, x, y=None):
        mean = self.linear(x).squeeze(-1)
        with pyro.plate("data", len(x)):
            return pyro.sample("obs", dist.Normal(mean, 0.5), obs=y)

pyro.set_rng_seed(0)
x = torch.randn(50, 3)
y = x @ torch.tensor([1.0, -2.0, 0.5]) + 0.1 * torch.randn(50)
model = Regression()
pyro.clear_param_store()
guide = AutoDiagonalNormal(model)
svi = SVI(model, guide, pyro.optim.Adam({{"lr": 0.05}}), Trace_ELBO())
losses = [svi.step(x, y) for _ in range(100)]
print(repr(losses[-1]), sorted(pyro.get_param_store().keys()))
"""

USE_PROBTRANS = f"""
import probtrans, probtrans.nn, probtrans.runs
from probtrans.specs import read_model_spec, read_inference_spec
probtrans.fit(
    read_model_spec("tiny.toml", {TINY_MODEL!r}),
    read_inference_spec("map.toml", "[train]\\nepochs = 1\\n[predictive]\\nsamples = 2\\n"),
    progress=False,
)
"""


def run_script(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=600
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_pyro_tutorial_trains_the_same_with_and_without_probtrans():
    """The tutorial sequence on a user's own model, after importing probtrans and fitting a run
    in the same process, gives the same final loss and the same param store as without."""
    without = run_script(TUTORIAL.format(prelude=""))
    with_probtrans = run_script(TUTORIAL.format(prelude=USE_PROBTRANS))
    assert with_probtrans.splitlines()[-1] == without
    assert "AutoDiagonalNormal.loc" in without
    assert pyro.settings.get("module_local_params") is False  # in this process too


FIRST_FIT = f"""
import random, threading
import probtrans
from probtrans.specs import read_model_spec, read_inference_spec

random.seed(1)
state, threads = random.getstate(), set(threading.enumerate())
run = probtrans.fit(
    read_model_spec("tiny.toml", {TINY_MODEL!r}),
    read_inference_spec("map.toml", "[train]\\nepochs = 1\\n[predictive]\\nsamples = 2\\n"),
)
columns = run.predict(run.data.test.inputs[:4], progress=True)
print(random.getstate() == state, sorted(t.name for t in set(threading.enumerate()) - threads))
"""


def test_the_first_fit_in_a_process_leaves_pythons_random_and_its_threads_as_they_were():
    """A fresh process's first ``probtrans.fit`` (its imports included; scikit-learn's import
    draws from ``random``) and ``predict`` with progress bars: Python's ``random`` is as the
    caller left it, and no thread (tqdm's monitor) is left running."""
    assert run_script(FIRST_FIT).splitlines()[-1] == "True []"


# --- probtrans.fit with any guide ---------------------------------------------------------


GUIDES = {
    "diagonal": AutoDiagonalNormal,
    "lowrank": functools.partial(AutoLowRankMultivariateNormal, rank=2, init_scale=0.05),
    "guide_list": normal_weight_delta_bias,
    "laplace": AutoLaplaceApproximation,
    "hand_written": functools.partial(hand_written, features=16),
}


@pytest.fixture
def specs():
    model = read_model_spec("tiny.toml", TINY_MODEL)
    inference = read_inference_spec(
        "tiny-map.toml",
        "[train]\nepochs = 2\nbatch_size = 128\nval_samples = 2\n[predictive]\nsamples = 4\n",
    )
    return model, inference


@pytest.mark.parametrize("name", list(GUIDES))
def test_fit_with_any_guide(specs, tmp_path, name):
    out = tmp_path / name
    run = probtrans.fit(*specs, out=out, guide=GUIDES[name], progress=False)
    history = json.loads((out / "history.json").read_text())
    assert all(math.isfinite(record["elbo"]) for record in history)
    assert run.path == out and math.isfinite(run.metrics["accuracy"])
    if name == "laplace":  # trained as MAP, then its Laplace approximation
        assert type(run.guide).__name__ == "AutoMultivariateNormal"
    reread = Run.load(out)
    given = getattr(GUIDES[name], "func", GUIDES[name])  # functools.partial
    assert reread.guide is None and reread.guide_name == run.guide_name
    assert reread.guide_name.startswith(given.__name__)  # its short label
    again = evaluate_run(out)  # the kept draws: the same predictive as the fit's
    assert again["accuracy"] == run.metrics["accuracy"]
    assert again["nll"] == run.metrics["nll"] and again["ece"] == run.metrics["ece"]
    with pytest.raises(ProbtransError, match="only 4 posterior draws"):
        reread.posterior_samples(5)


def test_an_autoguide_built_elsewhere_is_refused(specs, tmp_path):
    guide = AutoNormal(lambda: None)
    with pytest.raises(ProbtransError, match="built on another model; pass its class"):
        probtrans.fit(*specs, out=tmp_path / "run", guide=guide, progress=False)


def test_same_seed_fits_are_bitwise_equal(specs, tmp_path):
    first = probtrans.fit(*specs, out=tmp_path / "a", seed=3, progress=False)
    second = probtrans.fit(*specs, out=tmp_path / "b", seed=3, progress=False)
    for (name, a), (_, b) in zip(
        first.classifier.state_dict().items(), second.classifier.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert (tmp_path / "a" / "metrics.json").read_bytes() == (
        tmp_path / "b" / "metrics.json"
    ).read_bytes()
    assert (tmp_path / "a" / "probs.npz").read_bytes() == (
        tmp_path / "b" / "probs.npz"
    ).read_bytes()


def assert_random_state_is(state):
    now = pyro.util.get_rng_state()  # torch's, NumPy's and Python's
    assert torch.equal(now["torch"], state["torch"])
    assert now["random"] == state["random"]
    assert all(np.array_equal(a, b) for a, b in zip(now["numpy"], state["numpy"], strict=True))


def test_fit_predict_and_evaluate_leave_the_callers_random_state(specs, tmp_path):
    random.seed(11)
    np.random.seed(12)
    torch.manual_seed(13)
    state = pyro.util.get_rng_state()
    run = probtrans.fit(*specs, out=tmp_path / "run", seed=3, progress=False)
    assert_random_state_is(state)
    run.predict(run.data.test.inputs[:4])
    assert_random_state_is(state)
    run.posterior_samples(2, seed=5)
    run.module(draw=1)
    assert_random_state_is(state)
    evaluate_run(tmp_path / "run", seed=4)
    assert_random_state_is(state)
    Run.load(tmp_path / "run").predict(run.data.test.inputs[:2])
    assert_random_state_is(state)
    expected = (random.random(), np.random.rand(), torch.rand(()))
    random.seed(11)
    np.random.seed(12)
    torch.manual_seed(13)  # the caller's draws go on as if nothing had been called
    assert expected == (random.random(), np.random.rand(), torch.rand(()))


def test_fit_from_spec_files_and_a_temporary_folder(tiny_model_file, tmp_path):
    run = probtrans.fit(tiny_model_file, tiny_inference(tmp_path, "map"), epochs=1, progress=False)
    assert run.path.name.startswith("probtrans-run-") and (run.path / "metrics.json").is_file()


# --- what a trained run answers -----------------------------------------------------------


@pytest.fixture(scope="module")
def map_softmax_run(tmp_path_factory):
    """A deterministic run: softmax attention, MAP head, no dropout."""
    root = tmp_path_factory.mktemp("softmax")
    table = TINY_MODEL.split("[model.attention]")[0] + '[model.prior]\nweights = "last_layer"\n'
    model = read_model_spec("softmax.toml", table)
    inference = read_inference_spec(
        "map.toml",
        (ROOT / "inference" / "map.toml").read_text().split("[train]")[0]
        + "[train]\nepochs = 2\nbatch_size = 128\n[predictive]\nsamples = 4\n",
    )
    probtrans.fit(model, inference, out=root / "run", progress=False)
    return root / "run"


def test_module_is_the_trained_network(map_softmax_run):
    run = Run.load(map_softmax_run)
    network = run.module()
    test = run.data.test
    with torch.no_grad():
        logits = network.classifier(test.inputs, test.mask)
    assert accuracy(logits.softmax(-1).numpy(), test.labels.numpy()) == run.metrics["accuracy"]
    assert not isinstance(network, AutoGuideList) and not network.classifier.prior_sites
    assert not network.classifier.refuses_prior_draws and run.classifier.refuses_prior_draws
    assert network.state_dict().keys() == {
        f"classifier.{k}" for k in network.classifier.state_dict()
    }
    assert pyro.get_param_store().keys() == set()  # a plain module: nothing in the store
    drawn = run.module(draw=2)
    assert torch.equal(drawn.classifier.head.weight, run.posterior_samples(3)["head.weight"][2])


def test_an_unconditioned_classifier_refuses(map_softmax_run):
    run = Run.load(map_softmax_run)
    with pytest.raises(ProbtransError, match="draws them from the prior; use Run.predict"):
        run.classifier(run.data.test.inputs[:4])
    # under a Pyro handler it is the model: Predictive(parallel=False) samples it
    predictive = Predictive(run.classifier, guide=run.guide, num_samples=3, return_sites=["probs"])
    assert predictive(run.data.test.inputs[:4])["probs"].shape == (3, 4, 8)


def test_predict_on_new_images(map_softmax_run):
    run = Run.load(map_softmax_run)
    images = run.data.test.inputs[:5]
    columns = run.predict(images[:, 0], samples=4)  # (N, H, W) is read as one channel
    assert list(columns)[:2] == ["predicted", "p_0"] and len(columns["entropy"]) == 5
    probs = np.stack([columns[f"p_{name}"] for name in run.data.class_names], -1)
    np.testing.assert_allclose(probs.sum(-1), 1.0, rtol=1e-5)
    with pytest.raises(ProbtransError, match=r"this data set's images are \(N, 1, 8, 8\)"):
        run.predict(torch.zeros(2, 3, 8, 8))


def test_two_loaded_runs_keep_their_own_guides(specs, tmp_path):
    """Guides built by probtrans keep their parameters in their modules, so two runs sampled
    through plain Predictive in one session (param store in global mode) never share them."""
    a = probtrans.fit(*specs, out=tmp_path / "a", seed=0, progress=False)
    b = probtrans.fit(*specs, out=tmp_path / "b", seed=1, epochs=1, progress=False)
    inputs = a.data.test.inputs[:4]
    draws = {}
    for name, run in (("a", a), ("b", b)):
        predictive = Predictive(run.classifier, guide=run.guide, num_samples=1)
        draws[name] = predictive(inputs)["head.weight"].reshape(8, 16)
    assert not torch.equal(draws["a"], draws["b"])
    assert torch.equal(draws["b"], b.guide.median(inputs)["head.weight"])


def test_parallel_predictive_refuses_with_a_pointer(map_softmax_run):
    run = Run.load(map_softmax_run)
    predictive = Predictive(run.classifier, guide=run.guide, num_samples=3, parallel=True)
    with pytest.raises(ProbtransError, match="parallel=False"):
        predictive(run.data.test.inputs[:4])


def test_bad_guide_choice(specs, tmp_path):
    with pytest.raises(ProbtransError, match="takes neither a model"):
        probtrans.fit(*specs, out=tmp_path / "r", guide=lambda a, b: None, progress=False)


def test_user_module_subclass_is_kept_local():
    """A PyroModule built by the user in global mode keeps the default behaviour."""
    module = PyroModule[torch.nn.Linear](2, 1)
    module(torch.zeros(1, 2))
    assert "weight" in pyro.get_param_store().keys()


def test_predict_equals_the_predict_command(map_softmax_run, tmp_path):
    from probtrans.cli import main

    images = Run.load(map_softmax_run).data.test.inputs[:6].numpy()
    np.savez(tmp_path / "images.npz", x=images)
    out = tmp_path / "predictions.csv"
    assert (
        main(["predict", str(map_softmax_run), str(tmp_path / "images.npz"), "--out", str(out)])
        == 0
    )
    with open(out, newline="") as fh:
        rows = list(csv.DictReader(fh))
    columns = Run.load(map_softmax_run).predict(images)
    assert len(rows) == 6 and list(rows[0]) == ["row", *columns]  # the command adds the input
    assert [row["row"] for row in rows] == [str(i) for i in range(6)]
    for name, values in columns.items():
        written = [row[name] for row in rows]
        if values.dtype.kind in "US":
            assert written == values.tolist()
        else:
            np.testing.assert_array_equal(np.array(written, dtype=float), values)


# --- your own Pyro model from probtrans.nn layers -----------------------------------------


class TwoAttentionLayers(PyroModule):
    """A user's model: two probtrans attention layers and a Normal prior on the read-out."""

    def __init__(self) -> None:
        super().__init__()
        self.attn1 = StochasticAttention(d_model=8, n_heads=2, tau=0.5)
        self.attn2 = HierarchicalStochasticAttention(d_model=8, n_heads=2, n_centroids=2)
        self.readout = PyroModule[torch.nn.Linear](8, 2)
        self.readout.weight = PyroSample(dist.Normal(0.0, 1.0).expand([2, 8]).to_event(2))

    def forward(self, x, y=None):
        weight = self.readout.weight
        with pyro.plate("data", len(x)):
            h = self.attn2(x + self.attn1(x))
            logits = h.mean(1) @ weight.T + self.readout.bias
            return pyro.sample("y", dist.Categorical(logits=logits), obs=y)


def test_a_users_model_trains_with_an_autoguide_through_pyro_svi():
    """Under Pyro's default settings (param store), as a Pyro user writes it."""
    x = torch.randn(64, 5, 8)
    y = (x[:, :, 0].mean(1) > 0).long()
    model = TwoAttentionLayers()
    trace = pyro.poutine.trace(model).get_trace(x)
    sites = [name for name in trace.stochastic_nodes if name != "data"]  # not the plate's
    assert sites == ["readout.weight", "attn1.a_v", "attn2.a_c", "attn2.a_v", "y"]
    with pytest.raises(ProbtransError, match=r"'attn1.a_v' visible; build it on probtrans.self"):
        AutoNormal(model)(x, y)
    trainable = probtrans.self_guided(model)
    guide = AutoNormal(trainable)
    svi = SVI(trainable, guide, pyro.optim.Adam({"lr": 0.05}), Trace_ELBO())
    before = model.attn1.qkv.weight.detach().clone()
    losses = [svi.step(x, y) for _ in range(60)]
    assert np.mean(losses[-10:]) < 0.7 * np.mean(losses[:10])
    assert not torch.equal(model.attn1.qkv.weight, before)  # the attention layers train too
    store = pyro.get_param_store().keys()  # Pyro's default: parameters in the param store
    assert {"attn2.centroids", "AutoNormal.locs.readout.weight"} <= set(store)
    draws = Predictive(model, guide=guide, num_samples=3, return_sites=["attn1.a_v"])(x[:4])
    assert draws["attn1.a_v"].shape == (3, 4, 2, 5, 5)


def test_pyros_module_local_loop_trains_every_parameter_of_a_self_guided_model():
    """``Trace_ELBO()(self_guided(model), guide)`` holds the network's parameters as well as the
    guide's, so Pyro's module-local loop trains all of them, and the sites keep their names."""
    x = torch.randn(64, 5, 8)
    y = (x[:, :, 0].mean(1) > 0).long()
    with pyro.settings.context(module_local_params=True):
        model = TwoAttentionLayers()
        trainable = probtrans.self_guided(model)
        assert isinstance(trainable, torch.nn.Module) and trainable.model is model
        trace = pyro.poutine.trace(trainable).get_trace(x, y)
        assert [name for name, site in trace.nodes.items() if site["type"] == "sample"] == [
            "readout.weight",
            "data",
            "y",
        ]  # as named in the model, attention sites hidden
        assert list(trainable.state_dict()) == [f"model.{key}" for key in model.state_dict()]
        guide = AutoNormal(trainable)
        loss_fn = Trace_ELBO()(trainable, guide)
        loss_fn(x, y)  # creates the guide's parameters
        held = {id(p) for p in loss_fn.parameters()}
        assert {id(p) for p in model.parameters()} <= held
        assert {id(p) for p in guide.parameters()} <= held
        optimizer = torch.optim.Adam(loss_fn.parameters(), lr=0.02)
        before = {name: p.detach().clone() for name, p in model.named_parameters()}
        losses = []
        for _ in range(60):
            optimizer.zero_grad()
            loss = loss_fn(x, y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    assert np.mean(losses[-10:]) < 0.5 * np.mean(losses[:10])
    unchanged = [name for name, p in model.named_parameters() if torch.equal(p, before[name])]
    assert unchanged == []
    assert pyro.get_param_store().keys() == set()  # module-local: nothing in the store
    plain = probtrans.self_guided(lambda: pyro.sample("z", dist.Normal(0.0, 1.0)))
    assert list(plain.parameters()) == [] and plain().shape == ()


def test_the_readme_example_runs():
    done = subprocess.run(
        [sys.executable, "examples/own_model.py"], capture_output=True, text=True, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    accuracy = float(done.stdout.split("held-out accuracy")[1].split()[0])
    assert accuracy > 0.8


def test_the_pretrained_model_example_runs(tmp_path):
    from tests.tiny_backbones import save_tiny_backbone

    folder = save_tiny_backbone("bert", tmp_path / "bert")
    done = subprocess.run(
        [sys.executable, "examples/pretrained_model.py", str(folder)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert "encoder.model.encoder.layer.1.attention.self.attn.a_v" in out
    losses = [float(line.split("loss")[1]) for line in out.splitlines() if " loss " in line]
    assert len(losses) == 3 and losses[-1] < losses[0]
    assert out.count("of 50 predictive draws") == 2


def test_the_api_is_imported_on_first_use():
    out = run_script(
        "import sys, probtrans\n"
        "print('torch' in sys.modules)\n"
        "print(probtrans.Run.load.__qualname__, probtrans.fit.__module__,"
        " probtrans.self_guided.__name__, probtrans.DataBundle.__name__,"
        " probtrans.nn.Encoder.__name__)\n"
        "import pyro; print(pyro.settings.get('module_local_params'))"
    )
    assert out.splitlines() == [
        "False",
        "Run.load probtrans.runs.fitting self_guided DataBundle Encoder",
        "False",
    ]


def test_a_fit_without_out_removes_its_temporary_folder_when_closed_or_collected(tmp_path):
    """``fit`` without ``out`` writes into a temporary folder that the run removes: on
    ``close()``, on leaving ``with``, or when it is collected; a folder given as ``out`` stays."""
    import gc

    model = tmp_path / "tiny.toml"
    model.write_text(TINY_MODEL)
    inference = tiny_inference(tmp_path, "map")
    run = probtrans.fit(model, inference, epochs=1, progress=False)
    folder = run.path
    assert (folder / "metrics.json").is_file() and folder.name.startswith("probtrans-run-")
    run.close()
    assert not folder.exists()
    with probtrans.fit(model, inference, epochs=1, progress=False) as run:
        folder = run.path
        assert run.predict(run.data.test.inputs[:2], samples=2)["predicted"].shape == (2,)
    assert not folder.exists()
    folder = probtrans.fit(model, inference, epochs=1, progress=False).path
    gc.collect()
    assert not folder.exists()
    kept = probtrans.fit(model, inference, out=tmp_path / "kept", epochs=1, progress=False)
    kept.close()
    del kept
    gc.collect()
    assert (tmp_path / "kept" / "metrics.json").is_file()


@pytest.mark.parametrize("bad", [0, -3, 2.5, True, "4"])
def test_python_samples_and_seeds_are_checked_as_the_command_line_checks_them(tiny_run, bad):
    """``samples`` and ``seed`` of ``Run.predict``, ``Run.posterior_samples`` and
    ``evaluate_run``: a value the command line would refuse is one error naming the argument,
    never taken as the default nor a raw ``TypeError``."""
    run = Run.load(tiny_run)
    images = run.data.test.inputs[:3]
    samples = f"samples = {bad!r}: must be a positive integer"
    with pytest.raises(ProbtransError, match=re.escape(samples)):
        run.predict(images, samples=bad)
    with pytest.raises(ProbtransError, match=re.escape(samples)):
        run.posterior_samples(bad)
    with pytest.raises(ProbtransError, match=re.escape(samples)):
        evaluate_run(tiny_run, samples=bad)
    if bad != 0:  # a seed may be 0
        seed = f"seed = {bad!r}: must be an integer in 0"
        with pytest.raises(ProbtransError, match=re.escape(seed)):
            run.predict(images, seed=bad)
        with pytest.raises(ProbtransError, match=re.escape(seed)):
            run.posterior_samples(2, seed=bad)


def test_a_float64_default_dtype_of_the_caller_changes_nothing(tiny_run, tmp_path, tiny_model_file):
    """After ``torch.set_default_dtype(torch.float64)`` (common in GP code) ``fit``,
    ``Run.load`` and ``predict`` work as under float32, with the same predictions, and the
    caller's default is float64 again afterwards."""
    images = Run.load(tiny_run).data.test.inputs[:6]
    expected = Run.load(tiny_run).predict(images)["entropy"]
    torch.set_default_dtype(torch.float64)
    try:
        run = Run.load(tiny_run)
        assert torch.get_default_dtype() == torch.float64
        np.testing.assert_array_equal(run.predict(images)["entropy"], expected)
        refit = probtrans.fit(
            tiny_model_file, tiny_inference(tmp_path, "map"), out=tmp_path / "again", epochs=1
        )
        assert torch.get_default_dtype() == torch.float64
        assert refit.classifier.head.weight.dtype == torch.float32
    finally:
        torch.set_default_dtype(torch.float32)


def test_predict_in_chunks_gives_what_one_pass_gives(map_softmax_run, monkeypatch):
    """``Run.predict`` tokenises and predicts its inputs a chunk of rows at a time (its memory
    does not grow with them): chunks of 7 rows give the columns of a single pass, for images
    and a split with labels, row for row."""
    import probtrans.runs.run

    run = Run.load(map_softmax_run)
    split = run.data.test
    labels = split.labels[:30].numpy()
    for inputs in (split.inputs[:30].numpy(), split[:30]):
        monkeypatch.setattr(probtrans.runs.run, "PREDICT_CHUNK_ROWS", 1000)
        whole = run.predict(inputs, labels=labels)
        monkeypatch.setattr(probtrans.runs.run, "PREDICT_CHUNK_ROWS", 7)
        chunked = run.predict(inputs, labels=labels)
        assert list(chunked) == list(whole) and len(whole["entropy"]) == 30
        for name, values in whole.items():  # k-NN distances: cdist's matmul path differs
            if values.dtype.kind in "US":  # by a float rounding with the rows it is given
                np.testing.assert_array_equal(chunked[name], values, err_msg=name)
            else:
                np.testing.assert_allclose(chunked[name], values, rtol=1e-5, err_msg=name)


def test_predict_chunks_are_predict_a_chunk_at_a_time(tiny_run, monkeypatch):
    """``Run.predict_chunks`` gives ``predict``'s rows a chunk at a time, the same numbers
    (H-STO attention draws its weights), while the caller draws random numbers between the
    chunks: each chunk leaves the caller's random state as it found it, and the caller's draws
    change no prediction."""
    import probtrans.runs.run

    monkeypatch.setattr(probtrans.runs.run, "PREDICT_CHUNK_ROWS", 6)
    run = Run.load(tiny_run)
    inputs = run.data.test.inputs[:20].numpy()
    whole = run.predict(inputs, samples=3, seed=2)
    torch.manual_seed(5)
    state = pyro.util.get_rng_state()
    chunks = run.predict_chunks(inputs, samples=3, seed=2)
    assert_random_state_is(state)  # the draws and the validation predictive: on the call
    parts = []
    for columns in chunks:
        assert_random_state_is(state)
        parts.append(columns)
        torch.rand(3), np.random.rand(), random.random()  # the caller's own draws
        state = pyro.util.get_rng_state()
    assert [len(part["entropy"]) for part in parts] == [6, 6, 6, 2]
    for name, values in whole.items():
        np.testing.assert_array_equal(np.concatenate([p[name] for p in parts]), values, name)
    assert not np.allclose(whole["std_top"], 0)  # the draws differ: the random state matters
