"""A trained SGPA run's posterior predictive with the fast decoupled conditional and with the
float64 reference, on the same weights, posterior draws and seed.

The fast path (:func:`probtrans.gp.decoupled.decoupled_conditional`, its T × T work in float32
through :mod:`probtrans.gp.residual`) and the float64 reference
(:func:`~probtrans.gp.decoupled.decoupled_conditional_reference`, the path before issue 37)
compute the same moments (``tests/test_sgpa.py``, on the IMDB kernel settings). This script
checks it end to end on a trained run: it draws the predictive of the first ``--examples`` test
rows both ways and prints the largest difference of the predictive probabilities, and the
accuracy and ECE of each (Chen & Li, ICLR 2023, report both). Two runs trained on the two paths
part through rounding along SGD; this separates that from what the path computes.

    python benchmarks/sgpa_paths.py runs/imdb-sgpa --examples 1000   # about 5 min on 2 cores
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyro
import torch

import probtrans.attention.sgpa as sgpa
from probtrans import Run
from probtrans.analysis import metrics
from probtrans.data.bundle import DataSplit
from probtrans.inference.predictive import sample_predictive

SEED = 0


def first_rows(split: DataSplit, n: int) -> DataSplit:
    mask = None if split.mask is None else split.mask[:n]
    return DataSplit(split.inputs[:n], split.labels[:n], mask)


def predictive(
    run: Run, part: DataSplit, conditional: str, draws: dict[str, torch.Tensor]
) -> np.ndarray:
    """Probabilities (S, N, C) on the posterior ``draws`` (site → (S, ...)) with the SGPA layers'
    decoupled conditional on the path ``conditional`` (:mod:`probtrans.runtime.paths`)."""
    kept = run.classifier.paths
    run.classifier.paths = {**kept, "sgpa_conditional": conditional}
    try:
        samples = len(next(iter(draws.values())))
        pyro.set_rng_seed(SEED)  # the local randomness, as in evaluation
        batch = run.inference_spec.predictive.batch_size
        out = sample_predictive(run.classifier, None, part, samples, batch, run.device, draws=draws)
        return out["probs"]
    finally:
        run.classifier.paths = kept


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", help="a finished run folder whose model has decoupled SGPA layers")
    parser.add_argument("--examples", type=int, default=1000, help="first N test rows")
    parser.add_argument("--samples", type=int, default=10, help="posterior draws S")
    args = parser.parse_args(argv)
    if args.examples < 1 or args.samples < 1:
        parser.error("--examples and --samples must be at least 1")
    run = Run.load(args.run)
    if not any(isinstance(m, sgpa.SGPAttention) for m in run.classifier.modules()):
        parser.error(f"{args.run}: the model has no decoupled SGPA layer ([model.attention] kind)")
    part = first_rows(run.data.test, args.examples)
    labels = part.labels.numpy()
    draws = run.posterior_samples(args.samples, SEED)  # the same for both paths
    probs = {}
    for name, conditional in (("fast", "factored"), ("float64", "float64")):
        start = time.perf_counter()
        probs[name] = predictive(run, part, conditional, draws)
        mean = probs[name].mean(0)
        accuracy = (mean.argmax(1) == labels).mean()
        print(
            f"{name:8s} {time.perf_counter() - start:6.0f} s  accuracy {100 * accuracy:.2f} %  "
            f"ECE {100 * metrics.ece(mean, labels):.6f} %"
        )
    gap = np.abs(probs["fast"] - probs["float64"])
    print(
        f"{len(part)} test rows × {args.samples} draws: max |p_fast − p_float64| {gap.max():.2e} "
        f"(per draw), {np.abs(probs['fast'].mean(0) - probs['float64'].mean(0)).max():.2e} "
        "(predictive mean)"
    )


if __name__ == "__main__":
    main()
