"""Where the time of one SVI training step goes, split into its parts, in milliseconds and %.

The step is that of ``probtrans fit`` (:meth:`probtrans.inference.train.SVITraining.epoch`):
the same objective (:class:`~probtrans.inference.train.ElboObjective`: self-guided model, KL
weight, Trace_ELBO, the ELBO's terms for the history), guide, optimiser and schedule, on one
batch of the inference spec's ``train.batch_size`` rows, for

- the default digits model (``models/digits/h_sto.toml`` with ``inference/map.toml``: batch 32);
- the IMDB H-STO model (``models/imdb/h_sto.toml`` with ``inference/imdb/map.toml``: MAP guide,
  batch 128) on random token ids of 256 tokens (``benchmarks/speed.py``'s scale).

The parts, timed by clocks around them (medians over ``--repeats`` steps after ``--warmup``):

- model trace: the self-guided model's forward pass under the ELBO's trace (every Pyro site of
  the model, the network itself included);
- guide trace: the guide's forward pass under its trace;
- ELBO arithmetic: the rest of the loss (Pyro's trace bookkeeping, log-densities and their sums,
  the loss), of which "history terms" are the ELBO's terms at full weight that the history keeps
  (:func:`~probtrans.inference.objective.particle_terms`);
- backward: ``loss.backward()``;
- optimiser: ``optimizer.step()`` and the learning-rate schedule;
- other: the rest of the step (``zero_grad``, reading the loss, the batch).

Each model runs in its own process. With ``--device cuda`` the clocks are read after
``torch.cuda.synchronize()`` (which itself costs a little, and removes the overlap of the CPU's
work with the GPU's: the total is then above that of a step without clocks).

    python benchmarks/step_profile.py              # about 1 minute on a 2-core CPU
    python benchmarks/step_profile.py --repeats 50 --models digits
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyro
import torch

from probtrans.classifier import build_classifier
from probtrans.data import DataBundle, load_data
from probtrans.inference import objective as objective_module
from probtrans.inference.train import SVITraining
from probtrans.resolve import load_inference_spec, load_model_spec
from probtrans.runtime.caller_state import local_params

ROOT = Path(__file__).resolve().parents[1]
#: model → (model spec, inference spec)
MODELS = {
    "digits": ("models/digits/h_sto.toml", "inference/map.toml"),
    "imdb": ("models/imdb/h_sto.toml", "inference/imdb/map.toml"),
}
LENGTH, VOCAB, N_IMDB = 256, 20000, 22_500
#: the rows of the table, in order; "history terms" is a part of "ELBO arithmetic"
PARTS = (
    "model trace",
    "guide trace",
    "ELBO arithmetic",
    "  of which history terms",
    "backward",
    "optimiser",
    "other",
)


class Clocks:
    """Per-step seconds of named parts; on CUDA each reading waits for the GPU."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.steps: list[dict[str, float]] = []

    def now(self) -> float:
        if self.device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter()

    @contextmanager
    def part(self, name: str) -> Iterator[None]:
        start = self.now()
        try:
            yield
        finally:
            self.steps[-1][name] += self.now() - start

    def timed(self, name: str, function: Callable) -> Callable:
        """``function`` with its calls counted as the part ``name``."""

        def call(*args: Any, **kwargs: Any) -> Any:
            with self.part(name):
                return function(*args, **kwargs)

        return call


def imdb_data(rows: int) -> DataBundle:
    """Random token ids of ``LENGTH`` tokens, two classes; the training split has ``rows`` rows
    (the step's batch) and its N is IMDB's through the plate (``n_data``), as in speed.py."""
    generator = torch.Generator().manual_seed(0)

    def split(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.randint(1, VOCAB, (n, LENGTH), generator=generator), torch.arange(n) % 2

    return DataBundle.from_tensors(split(rows), split(8), split(8), vocab_size=VOCAB)


def profile(model: str, repeats: int, warmup: int, device: str) -> dict[str, Any]:
    """The parts of ``repeats`` timed steps of ``model`` (after ``warmup`` steps): medians and
    the median total, in seconds."""
    model_path, inference_path = (ROOT / p for p in MODELS[model])
    model_spec, spec = load_model_spec(model_path), load_inference_spec(inference_path)
    pyro.set_rng_seed(0)
    data = imdb_data(spec.train.batch_size) if model == "imdb" else load_data(model_spec.data)
    with local_params():  # as train_classifier runs
        classifier = build_classifier(model_spec, data).to(device)
        svi = SVITraining(classifier, data, spec, seed=0, device=device)
        if model == "imdb":
            svi.objective.n_data = N_IMDB
        clocks = Clocks(device)
        objective = svi.objective
        objective.model = clocks.timed("model trace", objective.model)
        objective.weighted_guide = clocks.timed("guide trace", objective.weighted_guide)
        history_terms = objective_module.particle_terms
        objective_module.particle_terms = clocks.timed("  of which history terms", history_terms)
        index = svi.data.train.batch_indices(spec.train.batch_size, shuffle=False)[0]
        classifier.train()
        for _ in range(warmup + repeats):
            clocks.steps.append(defaultdict(float))
            start = clocks.now()
            svi.kl_weight.annealing = 1.0
            svi.optimizer.zero_grad()
            batch = svi.data.train.batch(index)
            with clocks.part("loss"):
                loss, _ = svi.training_loss(*batch)
            loss.item()
            with clocks.part("backward"):
                loss.backward()
            with clocks.part("optimiser"):
                svi.optimizer.step()
                svi.schedule.step()
            clocks.steps[-1]["total"] = clocks.now() - start
        objective_module.particle_terms = history_terms
    steps = clocks.steps[warmup:]
    for step in steps:
        step["ELBO arithmetic"] = step["loss"] - step["model trace"] - step["guide trace"]
        named = ("model trace", "guide trace", "ELBO arithmetic", "backward", "optimiser")
        step["other"] = step["total"] - sum(step[name] for name in named)
    medians = {name: statistics.median(step[name] for step in steps) for name in PARTS}
    total = statistics.median(step["total"] for step in steps)
    return {"parts": medians, "total": total, "batch": spec.train.batch_size}


def measure(model: str, repeats: int, warmup: int, device: str) -> dict[str, Any]:
    """Profile one model in a fresh process."""
    command = [sys.executable, __file__, "--model", model, "--repeats", str(repeats)]
    command += ["--warmup", str(warmup), "--device", device]
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
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--models", nargs="+", choices=list(MODELS), default=list(MODELS))
    parser.add_argument("--model", choices=list(MODELS), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("step_profile.py --device cuda: no CUDA device on this machine")
    if args.model:
        print(json.dumps(profile(args.model, args.repeats, args.warmup, args.device)))
        return

    gpu = f"{torch.cuda.get_device_name()} on " if args.device == "cuda" else ""
    print(
        f"{gpu}{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"pyro {pyro.__version__}, {torch.get_num_threads()} threads, "
        f"medians of {args.repeats} steps"
    )
    results = {
        model: measure(model, args.repeats, args.warmup, args.device) for model in args.models
    }
    labels = [f"{model} (B = {results[model]['batch']})" for model in args.models]
    header = "".join(f"{label:>24}" for label in labels)
    print(f"\n{'part of one SVI step':<26}{header}")
    for part in PARTS:
        cells = ""
        for model in args.models:
            seconds, total = results[model]["parts"][part], results[model]["total"]
            cells += f"{seconds * 1e3:14.2f} ms {100 * seconds / total:5.1f} %"
        print(f"{part:<26}{cells}")
    totals = "".join(f"{results[m]['total'] * 1e3:14.2f} ms {'':7}" for m in args.models)
    print(f"{'step (median)':<26}{totals}")
    print("\nthe parts are medians of their own: they need not add up to the step's median")


if __name__ == "__main__":
    main()
