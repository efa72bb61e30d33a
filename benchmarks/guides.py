"""Guides compared on one model: ``probtrans.fit`` with the inference spec's guide and five guides
given in Python, each fitted, evaluated and re-evaluated from its run folder. Prints the README's
table ("Fit a spec, with any guide"): the training-set ELBO per example at the kept state
(unannealed, ``metrics.json`` ``elbo``), test metrics, the held-out ELPD with its standard error
and PSIS-LOO over the training examples (``†``: a point mass, whose LOO is its in-sample log
predictive density with p_loo = 0; ``!``: unreliable, Pareto k̂ too high on more than 5 % of
the training examples).

    python benchmarks/guides.py [--model models/digits/h_sto.toml] [--inference inference/map.toml]
"""

from __future__ import annotations

import argparse
import functools
import tempfile
import time
from pathlib import Path

import pyro
import pyro.distributions as dist
import torch
from pyro.infer.autoguide import (
    AutoDelta,
    AutoDiagonalNormal,
    AutoGuideList,
    AutoLaplaceApproximation,
    AutoLowRankMultivariateNormal,
    AutoNormal,
)
from torch.distributions import constraints

import probtrans
from probtrans.analysis.elpd import POINT_MASS, UNRELIABLE
from probtrans.runs import evaluate_run


def hand_written(inputs, mask=None, labels=None, index=None, n_data=None, *, features=64):
    """A guide written by hand: mean-field Normal over the head of 8 classes × ``features`` (64 in
    the default digits model)."""
    for name, shape in (("head.weight", (8, features)), ("head.bias", (8,))):
        loc = pyro.param(f"q.{name}.loc", torch.zeros(shape))
        scale = pyro.param(f"q.{name}.scale", 0.01 * torch.ones(shape), constraints.positive)
        pyro.sample(name, dist.Normal(loc, scale).to_event(len(shape)))


def normal_weight_delta_bias(model):
    guide = AutoGuideList(model)
    guide.append(AutoNormal(pyro.poutine.block(model, expose=["head.weight"]), init_scale=0.01))
    guide.append(AutoDelta(pyro.poutine.block(model, hide=["head.weight"])))
    return guide


GUIDES = {
    "the spec's": None,
    "AutoDiagonalNormal": functools.partial(AutoDiagonalNormal, init_scale=0.01),
    "AutoLowRankMultivariateNormal (rank 4)": functools.partial(
        AutoLowRankMultivariateNormal, rank=4, init_scale=0.01
    ),
    "AutoGuideList (Normal weight, Delta bias)": normal_weight_delta_bias,
    "AutoLaplaceApproximation": AutoLaplaceApproximation,
    "hand-written mean-field Normal": hand_written,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="models/digits/h_sto.toml")
    parser.add_argument("--inference", default="inference/map.toml")
    args = parser.parse_args()
    print(
        "| guide | ELBO / example | accuracy | NLL | ECE | test ELPD (SE) | LOO (p_loo) "
        "| OOD AUROC (entropy) | re-evaluated accuracy | seconds |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as root:
        for i, (name, guide) in enumerate(GUIDES.items()):
            started = time.perf_counter()
            out = Path(root) / str(i)
            run = probtrans.fit(args.model, args.inference, out=out, guide=guide, progress=False)
            seconds = time.perf_counter() - started
            m, again = run.metrics, evaluate_run(out)
            auroc = [report["entropy"]["auroc"] for report in m["ood"].values()]
            mark = {POINT_MASS: "†", UNRELIABLE: "!"}.get(m["loo_note"].split(":")[0], "")
            loo = "–" if m["loo"] is None else f"{m['loo']:.1f} ({m['p_loo']:.1f}){mark}"
            print(
                f"| {name} | {m['elbo']:.3f} | {m['accuracy']:.4f} | {m['nll']:.4f} "
                f"| {m['ece']:.4f} | {m['test_elpd']:.1f} ({m['test_elpd_se']:.1f}) "
                f"| {loo} | {', '.join(f'{a:.4f}' for a in auroc)} "
                f"| {again['accuracy']:.4f} | {seconds:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
