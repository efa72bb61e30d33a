"""Speed and peak memory of stochastic attention, SVI training steps and the posterior predictive.

Everything runs in one invocation on one machine, so the printed ratios compare like with like.
The scale is H-STO's IMDB setting (Pei et al. 2022): batch 128, sequence length 256, width 128,
8 heads of width 16, on random token ids (the timings do not depend on the words).

1. One attention layer, forward + backward, as ratios to deterministic fused attention
   (``softmax``, PyTorch's ``scaled_dot_product_attention``): STO and H-STO on their fused path
   (as in training) and on the site path (Pyro sample sites, as when attention is recorded),
   and decoupled SGPA on the paths its device takes (``probtrans.runtime.paths``, printed in the
   header; ``benchmarks/paths.py`` times each) and with the all-float64 conditional.
2. One training step of the full 1-layer H-STO IMDB network (``models/imdb/h_sto.toml``, MAP
   guide): the SVI step of ``probtrans fit`` (self-guided model, ``AutoDelta``, Trace_ELBO,
   Adam), the same computation written in plain PyTorch (same modules, loss N/B·CE − log p(W)),
   and the network with deterministic attention trained in plain PyTorch (CE loss, Adam). The
   same pair on the default digits model (``models/digits/h_sto.toml`` with
   ``inference/map.toml``, batch 32), where Pyro's fixed costs per step weigh more: the step of
   the training loop itself (``SVITraining``: its objective, Adam and schedule) against the
   same modules, MAP loss and optimiser in plain PyTorch, with its goal (≤ 1.15×). The
   training step on the IMDB SGPA model (``models/imdb/sgpa.toml`` with
   ``inference/imdb/sgpa.toml``, batch 32), with the fast and the all-float64 conditional.
   The goals of issue 37 are printed last, each met or not; each time ratio among them is the
   median of this run's and ``--pairs`` more runs of its two cases back to back (this shared
   machine's speed drifts by up to 1.5× over minutes, which one pair cannot tell from a gap).
3. The posterior predictive of that model with S = 10 on N examples: ``probtrans.predict`` with
   S = 10 (one batched pass per batch), 10 sequential single-sample ``predict`` calls,
   ``pyro.infer.Predictive(num_samples=10)`` called per batch, and 10 sequential calls of
   ``Predictive(num_samples=1)`` per batch (each call also runs the model twice to find its
   plate nesting and site shapes); ``predict`` on 4N examples,
   whose peak memory should not grow with N; and the same S = 10 against 10 single-sample calls
   on the default digits model, where fixed per-call costs weigh more.

Each case runs in its own process; "peak MiB" is that process's peak resident memory above
what it held once its inputs were built. With ``--device cuda`` every case runs on the GPU
(modules, inputs and labels on it; ``predict`` moves each batch there), all in this process, the
clock is read after ``torch.cuda.synchronize()``, and "peak GPU MiB" is the case's peak
allocated GPU memory above what was allocated once its inputs were built. Times are medians
over ``--repeats`` runs (more for a short step, until they take 2 s in all) after warm-up runs
of 0.5 s (at least one).

    python benchmarks/speed.py                # 2-core CPU: about 6 min, then the goals' pairs
    python benchmarks/speed.py --repeats 3 --examples 256
    python benchmarks/speed.py --device cuda  # every case on the GPU
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pyro
import torch
import torch.nn.functional as F
from pyro import poutine
from pyro.infer import Predictive, Trace_ELBO
from torch import nn

from probtrans.classifier import PatchEmbedding, TokenEmbedding, build_classifier
from probtrans.contract import fused_attention
from probtrans.data import DataBundle, DataSplit, load_data
from probtrans.inference.guide_builder import build_guide
from probtrans.inference.objective import self_guided
from probtrans.inference.predictive import sample_predictive
from probtrans.inference.train import SVITraining
from probtrans.nn import (
    Encoder,
    HierarchicalStochasticAttention,
    SGPAttention,
    SoftmaxAttention,
    StochasticAttention,
)
from probtrans.resolve import load_inference_spec, load_model_spec
from probtrans.runtime.paths import paths_for, use_paths
from probtrans.runtime.stopwatch import duration
from probtrans.specs import GuideSpec, InferenceSpec, ModelSpec

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "models" / "imdb" / "h_sto.toml"
DIGITS = ROOT / "models" / "digits" / "h_sto.toml"
DIGITS_INFERENCE = ROOT / "inference" / "map.toml"
#: goal of the SGPA layer's time and peak memory against deterministic attention's (issue 37)
SGPA_GOAL = 4.0
SGPA_SPEC = ROOT / "models" / "imdb" / "sgpa.toml"
SGPA_INFERENCE = ROOT / "inference" / "imdb" / "sgpa.toml"
BATCH, LENGTH, VOCAB, SAMPLES = 128, 256, 20000, 10


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


#: seconds of warm-up runs before the timed ones (at least one), and the least time the timed
#: runs take in all: a short step (the digits model's, about 15 ms) is run until then, not
#: ``--repeats`` times only, so that its median is that of a steady state
WARMUP_SECONDS, MIN_SECONDS = 0.5, 2.0


def median_seconds(step: Callable[[], None], repeats: int, device: str) -> float:
    def timed() -> float:
        start = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()  # wait for the step's kernels
        return time.perf_counter() - start

    warm = timed()
    while warm < WARMUP_SECONDS:
        warm += timed()
    times = [timed() for _ in range(repeats)]
    while sum(times) < MIN_SECONDS:
        times.append(timed())
    return statistics.median(times)


def tokens(n: int) -> torch.Tensor:
    return torch.randint(1, VOCAB, (n, LENGTH), generator=torch.Generator().manual_seed(n))


# --- 1. attention layers --------------------------------------------------------------------


def attention_layer(kind: str, fused: bool, device: str) -> Callable[[], None]:
    net = load_model_spec(SPEC).network
    width, heads = net.d_model, net.n_heads
    if kind == "softmax":
        layer = SoftmaxAttention(width, heads)
    elif kind == "sto":
        layer = StochasticAttention(width, heads, tau=40.0)  # H-STO paper's STO-TRANS setting
    elif kind == "h_sto":
        layer = HierarchicalStochasticAttention(
            width, heads, **net.attention.model_dump(exclude={"kind"})
        )
    else:  # "sgpa", or "sgpa_float64": the all-float64 conditional of before issue 37
        layer = SGPAttention(width, heads, n_inducing=16, kernel="ard")
        if kind == "sgpa_float64":
            use_float64_conditional()
    layer.to(device)
    x = torch.randn(BATCH, LENGTH, width, device=device, requires_grad=True)

    def step() -> None:
        layer.zero_grad(set_to_none=True)
        with poutine.block():  # sites drawn as in training, recorded nowhere
            if fused:
                with fused_attention():
                    out = layer(x)
            else:
                out = layer(x)
        out.sum().backward()

    return step


# --- 2. training steps ----------------------------------------------------------------------


class PlainNetwork(nn.Module):
    """The network of the model spec ``spec`` (IMDB's by default) in plain PyTorch, without the
    Pyro model around it: the classifier's embedding (IMDB's token embedding by default),
    dropout, encoder (``kind``: ``h_sto`` for the spec's attention, else ``softmax``), mean
    pooling (no padding here) and linear head to ``n_classes``."""

    def __init__(
        self,
        kind: str,
        spec: Path = SPEC,
        embedding: nn.Module | None = None,
        n_classes: int = 2,
    ) -> None:
        super().__init__()
        net = load_model_spec(spec).network
        if embedding is None:
            embedding = TokenEmbedding(VOCAB, net.max_positions, net.d_model)
        self.embedding = embedding
        self.drop = nn.Dropout(net.dropout)
        self.encoder = Encoder(
            net.d_model,
            net.n_heads,
            net.n_layers,
            d_ff=net.d_ff,
            dropout=net.dropout,
            norm=net.norm,
            attention=net.attention if kind == "h_sto" else "softmax",
        )
        self.head = nn.Linear(net.d_model, n_classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.drop(self.embedding(inputs))).mean(1))


def plain_step(kind: str, with_prior: bool, device: str) -> Callable[[], None]:
    """The IMDB training step in plain PyTorch (:func:`plain_map_step`, lr 1e-3)."""
    network = PlainNetwork(kind).to(device)
    inputs, labels = tokens(BATCH).to(device), torch.randint(2, (BATCH,)).to(device)
    scale = load_model_spec(SPEC).network.prior.scale if with_prior else None
    return plain_map_step(network, inputs, labels, 22_500, scale, 1e-3)


def plain_map_step(
    network: PlainNetwork,
    inputs: torch.Tensor,
    labels: torch.Tensor,
    n_train: int,
    scale: float | None,
    lr: float,
) -> Callable[[], None]:
    """Training step in plain PyTorch with Adam; with a prior scale s, the loss is the MAP
    objective of the SVI step: N/B · Σ CE − log N(head | 0, s²) (without one, N/B · Σ CE)."""
    head, batch = network.head, len(inputs)
    optimizer = torch.optim.Adam(network.parameters(), lr=lr)

    def step() -> None:
        optimizer.zero_grad()
        with fused_attention():
            logits = network(inputs)
        loss = n_train / batch * F.cross_entropy(logits, labels, reduction="sum")
        if scale is not None:
            prior = torch.distributions.Normal(0.0, scale)
            loss = loss - prior.log_prob(head.weight).sum() - prior.log_prob(head.bias).sum()
        loss.backward()
        optimizer.step()

    return step


def plain_digits_step(device: str) -> Callable[[], None]:
    """The digits SVI step's computation in plain PyTorch: the default digits model's patch
    embedding, dropout, encoder, mean pooling and head, its MAP loss and the optimiser and
    batch (32 rows) of ``inference/map.toml`` (:func:`plain_map_step`)."""
    spec, inference = load_model_spec(DIGITS), load_inference_spec(DIGITS_INFERENCE)
    data, net = load_data(spec.data), spec.network
    embedding = PatchEmbedding(data.image_shape, spec.data.patch_size, net.d_model)
    network = PlainNetwork("h_sto", DIGITS, embedding, data.n_classes).to(device)
    _, inputs, _, labels = data.train.batch(torch.arange(inference.train.batch_size))
    return plain_map_step(
        network,
        inputs.to(device),
        labels.to(device),
        len(data.train),
        net.prior.scale,
        inference.optim.lr,
    )


def svi_digits_step(device: str) -> Callable[[], None]:
    """The training step of ``probtrans fit`` on the default digits model with
    ``inference/map.toml`` (MAP guide, batch 32) (:func:`training_loop_step`)."""
    spec, inference = load_model_spec(DIGITS), load_inference_spec(DIGITS_INFERENCE)
    return training_loop_step(spec, inference, load_data(spec.data), device)


def training_loop_step(
    spec: ModelSpec, inference: InferenceSpec, data: DataBundle, device: str
) -> Callable[[], None]:
    """One step of the training loop itself on the first batch of ``data``'s training split:
    the loop's objective (:meth:`~probtrans.inference.train.SVITraining.training_loss`),
    backward, optimiser and schedule, with module-local parameters as ``train_classifier``
    runs them."""
    pyro.settings.set(module_local_params=True)  # for this case's process
    classifier = build_classifier(spec, data).to(device)
    svi = SVITraining(classifier, data, inference, seed=0, device=device)
    batch = data.train.batch(torch.arange(inference.train.batch_size))
    classifier.train()

    def step() -> None:
        svi.optimizer.zero_grad()
        loss, _ = svi.training_loss(*batch)
        loss.item()  # the loop reads the loss of every step
        loss.backward()
        svi.optimizer.step()
        svi.schedule.step()

    return step


def data_bundle(n: int) -> DataBundle:
    split = DataSplit(tokens(n), torch.randint(2, (n,)))
    return DataBundle(
        "synthetic", split, split, split, split, ["neg", "pos"], "tokens", None, VOCAB
    )


def svi_step(device: str) -> Callable[[], None]:
    """The step of ``probtrans.inference.train.train_classifier``: self-guided model, delta guide,
    Trace_ELBO, Adam."""
    data = data_bundle(BATCH)
    classifier = build_classifier(load_model_spec(SPEC), data).to(device)
    model = self_guided(classifier)
    guide = build_guide(classifier, GuideSpec(name="delta"), data.train, device)
    inputs, labels = tokens(BATCH).to(device), torch.randint(2, (BATCH,)).to(device)
    index = torch.arange(BATCH, device=device)
    optimizer = torch.optim.Adam(list(classifier.parameters()) + list(guide.parameters()), 1e-3)
    elbo = Trace_ELBO()

    def step() -> None:
        optimizer.zero_grad()
        loss = elbo.differentiable_loss(model, guide, inputs, None, labels, index, 22_500)
        loss.backward()
        optimizer.step()

    return step


#: the paths this case's process takes where it chooses one (each case runs in its own process)
PROCESS_PATHS = contextlib.ExitStack()


def use_float64_conditional() -> None:
    """Make SGPA layers (in this case's process) compute their decoupled conditional in float64
    throughout, T × T matrices included: the path before issue 37, kept as the tests'
    reference and as the ``"float64"`` path (:mod:`probtrans.runtime.paths`)."""
    PROCESS_PATHS.enter_context(use_paths(sgpa_conditional="float64"))


def svi_sgpa_step(device: str, float64: bool = False) -> Callable[[], None]:
    """The training step of ``probtrans fit`` on the IMDB SGPA model (``models/imdb/sgpa.toml``,
    2 layers, M_g = 50) with ``inference/imdb/sgpa.toml`` (delta weights, Cholesky u_g guide,
    batch 32), on random token ids of length L (:func:`training_loop_step`); ``float64``: with
    the all-float64 conditional."""
    if float64:
        use_float64_conditional()
    inference = load_inference_spec(SGPA_INFERENCE)
    data = data_bundle(inference.train.batch_size)
    return training_loop_step(load_model_spec(SGPA_SPEC), inference, data, device)


# --- 3. posterior predictive ----------------------------------------------------------------


def predictive(mode: str, n: int, device: str) -> Callable[[], None]:
    data = data_bundle(n)  # on the CPU: predict moves each batch to the device, as here
    classifier = build_classifier(load_model_spec(SPEC), data).to(device)
    model = self_guided(classifier)
    guide = build_guide(classifier, GuideSpec(name="delta"), data.test, device)
    rows = 2 * BATCH  # rows per pass ([predictive] batch_size of the inference specs)

    def vectorised() -> None:
        sample_predictive(classifier, guide, data.test, SAMPLES, rows, device=device)

    def sequential() -> None:
        for _ in range(SAMPLES):
            sample_predictive(classifier, guide, data.test, 1, rows, device=device)

    def pyro_predictive(samples: int, calls: int) -> None:
        runner = Predictive(model, guide=guide, num_samples=samples, return_sites=["probs"])
        classifier.eval()
        with torch.no_grad():
            for _, inputs, _, _ in data.test.batches(rows):
                for _ in range(calls):
                    runner(inputs.to(device), None)

    return {
        "vectorised": vectorised,
        "sequential": sequential,
        "pyro": lambda: pyro_predictive(SAMPLES, 1),
        "pyro_sequential": lambda: pyro_predictive(1, SAMPLES),
    }[mode]


def digits_predictive(mode: str, device: str) -> Callable[[], None]:
    """S = 10 on the 289 test digits with the default model, where per-call costs matter."""
    spec = load_model_spec(ROOT / "models" / "digits" / "h_sto.toml")
    data = load_data(spec.data)
    classifier = build_classifier(spec, data).to(device)
    guide = build_guide(classifier, GuideSpec(name="delta"), data.test, device)
    if mode == "vectorised":
        return lambda: sample_predictive(classifier, guide, data.test, SAMPLES, 256, device=device)
    return lambda: [
        sample_predictive(classifier, guide, data.test, 1, 256, device=device)
        for _ in range(SAMPLES)
    ]


CASES: dict[str, tuple[str, Callable[[int, str], Callable[[], None]]]] = {
    "attn_softmax": (
        "deterministic (fused SDPA)",
        lambda n, d: attention_layer("softmax", True, d),
    ),
    "attn_sto": ("STO, fused path", lambda n, d: attention_layer("sto", True, d)),
    "attn_h_sto": ("H-STO, fused path", lambda n, d: attention_layer("h_sto", True, d)),
    "attn_sto_site": ("STO, site path", lambda n, d: attention_layer("sto", False, d)),
    "attn_h_sto_site": ("H-STO, site path", lambda n, d: attention_layer("h_sto", False, d)),
    "attn_sgpa": (
        "SGPA, the device's paths (M_g = 16)",
        lambda n, d: attention_layer("sgpa", False, d),
    ),
    "attn_sgpa_float64": (
        "SGPA, all-float64 conditional",
        lambda n, d: attention_layer("sgpa_float64", False, d),
    ),
    "step_plain_softmax": (
        "plain PyTorch, deterministic",
        lambda n, d: plain_step("softmax", False, d),
    ),
    "step_plain_h_sto": (
        "plain PyTorch, H-STO MAP loss",
        lambda n, d: plain_step("h_sto", True, d),
    ),
    "step_svi_h_sto": ("Pyro SVI, H-STO MAP", lambda n, d: svi_step(d)),
    "step_svi_sgpa": ("IMDB SGPA SVI step, B = 32", lambda n, d: svi_sgpa_step(d)),
    "step_svi_sgpa_float64": (
        "IMDB SGPA step, float64 conditional",
        lambda n, d: svi_sgpa_step(d, float64=True),
    ),
    "step_plain_digits": ("digits: plain PyTorch MAP step", lambda n, d: plain_digits_step(d)),
    "step_svi_digits": ("digits: probtrans SVI step", lambda n, d: svi_digits_step(d)),
    "predict_vectorised": ("predict, S = 10 batched", lambda n, d: predictive("vectorised", n, d)),
    "predict_sequential": ("10 × predict, S = 1", lambda n, d: predictive("sequential", n, d)),
    "predict_pyro": ("pyro Predictive, S = 10", lambda n, d: predictive("pyro", n, d)),
    "predict_pyro_sequential": (
        "10 × pyro Predictive, S = 1",
        lambda n, d: predictive("pyro_sequential", n, d),
    ),
    "predict_vectorised_4n": (
        "predict, S = 10, 4N",
        lambda n, d: predictive("vectorised", 4 * n, d),
    ),
    "digits_vectorised": (
        "digits: predict, S = 10",
        lambda n, d: digits_predictive("vectorised", d),
    ),
    "digits_sequential": ("digits: 10 × predict, S = 1", lambda n, d: digits_predictive("seq", d)),
}


def run_case(name: str, repeats: int, examples: int, device: str) -> dict[str, float]:
    """Run one case in this process and return its time and its peak memory above what it held
    once its inputs were built: resident memory on the CPU, allocated GPU memory on CUDA."""
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    step = CASES[name][1](examples, device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated() / 2**20
        seconds = median_seconds(step, repeats, device)
        peak = torch.cuda.max_memory_allocated() / 2**20
    else:
        before = rss_mib()
        seconds = median_seconds(step, repeats, device)
        peak = peak_rss_mib()
    return {"seconds": seconds, "peak_mib": max(0.0, peak - before)}


def measure(name: str, repeats: int, examples: int, device: str) -> dict[str, float]:
    """Run one case: on the CPU in a fresh process, so that its peak resident memory is its own;
    on a GPU in this process, whose peak allocated memory is reset per case (a fresh process
    took some 16 s a case on an H200, its imports and CUDA's start: the whole benchmark did not
    fit a 15-minute loan)."""
    if device == "cuda":
        pyro.clear_param_store()
        result = run_case(name, repeats, examples, device)
        gc.collect()  # the case's modules and inputs, before the next one's peak
        torch.cuda.empty_cache()
        return result
    command = [sys.executable, __file__, "--case", name, "--repeats", str(repeats)]
    command += ["--examples", str(examples), "--device", device]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--pairs", type=int, default=2, help="extra back-to-back runs of each goal's two cases"
    )
    parser.add_argument("--examples", type=int, default=128, help="N of the predictive cases")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--case", choices=list(CASES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("speed.py --device cuda: no CUDA device on this machine")
    if args.case:
        print(json.dumps(run_case(args.case, args.repeats, args.examples, args.device)))
        return

    gpu = f"{torch.cuda.get_device_name()} on " if args.device == "cuda" else ""
    print(
        f"{gpu}{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads, median of {args.repeats} runs (short steps: "
        f"of {MIN_SECONDS:g} s of runs), after {WARMUP_SECONDS:g} s of warm-up"
    )
    print(f"B = {BATCH}, L = {LENGTH}, D = 128, H = 8, d_h = 16; predictive N = {args.examples}")
    print(f"paths on {args.device} (probtrans.runtime.paths): {paths_for(args.device)}\n")
    peak = "peak GPU" if args.device == "cuda" else "peak"
    results = {}
    for name, (label, _) in CASES.items():
        results[name] = measure(name, args.repeats, args.examples, args.device)
        print(
            f"  {label:<32} {duration(results[name]['seconds']):>9}  "
            f"{peak} {results[name]['peak_mib']:7.0f} MiB",
            flush=True,
        )

    ratios = [
        (f"attention {kind} / deterministic", f"attn_{kind}", "attn_softmax")
        for kind in ("sto", "h_sto", "sto_site", "h_sto_site", "sgpa")
    ]
    ratios += [
        ("SVI H-STO step / plain deterministic step", "step_svi_h_sto", "step_plain_softmax"),
        ("SVI H-STO step / plain H-STO step", "step_svi_h_sto", "step_plain_h_sto"),
        ("digits: SVI step / plain step", "step_svi_digits", "step_plain_digits"),
        ("SGPA layer: device's paths / float64 conditional", "attn_sgpa", "attn_sgpa_float64"),
        ("IMDB SGPA step: device's paths / float64", "step_svi_sgpa", "step_svi_sgpa_float64"),
        ("predict S = 10 / 10 sequential calls", "predict_vectorised", "predict_sequential"),
        ("predict S = 10 / pyro Predictive S = 10", "predict_vectorised", "predict_pyro"),
        (
            "predict S = 10 / 10 × pyro Predictive S = 1",
            "predict_vectorised",
            "predict_pyro_sequential",
        ),
        ("digits: predict S = 10 / 10 sequential calls", "digits_vectorised", "digits_sequential"),
    ]
    print("\nratios (one run):")
    for label, a, b in ratios:
        print(f"  {label:<42} {results[a]['seconds'] / results[b]['seconds']:5.2f}×")
    growth = (
        results["predict_vectorised_4n"]["peak_mib"] - results["predict_vectorised"]["peak_mib"]
    )
    print(f"  {f'predict {peak} memory, 4N minus N':<42} {growth:+5.0f} MiB")

    def time_ratios(a: str, b: str) -> list[float]:
        """This run's ratio of the times of cases a and b, then ``--pairs`` more, each pair run
        back to back, so that the machine's drift falls on both cases alike."""
        ratios = [results[a]["seconds"] / results[b]["seconds"]]
        for _ in range(args.pairs):
            again = measure(a, args.repeats, args.examples, args.device)["seconds"]
            ratios.append(again / measure(b, args.repeats, args.examples, args.device)["seconds"])
        return ratios

    memory = results["attn_sgpa"]["peak_mib"] / max(results["attn_softmax"]["peak_mib"], 1e-9)
    goals = [
        ("SGPA layer / fused SDPA", time_ratios("attn_sgpa", "attn_softmax"), SGPA_GOAL),
        (f"SGPA {peak} memory / deterministic's", [memory], SGPA_GOAL),
        ("digits SVI step / plain step", time_ratios("step_svi_digits", "step_plain_digits"), 1.15),
        (
            "IMDB H-STO SVI step / plain step",
            time_ratios("step_svi_h_sto", "step_plain_h_sto"),
            0.97,
        ),
    ]
    pairs = args.pairs + 1
    print(f"\ngoals (issue 37; each time ratio the median of {pairs} pairs, their range after it):")
    for label, values, goal in goals:
        value = statistics.median(values)
        verdict = "met" if value <= goal else "not met"
        spread = f"({min(values):.2f}–{max(values):.2f})" if len(values) > 1 else ""
        print(f"  {label:<38} {value:5.2f}× {spread:<11} goal ≤ {goal}×: {verdict}")


if __name__ == "__main__":
    main()
