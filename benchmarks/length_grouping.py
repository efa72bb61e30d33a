"""What length-grouped batches save on IMDB: padded tokens per epoch and SVI step time.

IMDB reviews cut to 512 tokens fill about half of them on average, so plain shuffled batches of
128 are nearly all padded to 512, while ``DataSplit.batches(by_length=True)`` (the
``[train] group_by_length`` setting; ``predict`` always sorts by length) groups reviews of
similar length and trims each batch to its longest review. This script prints, on the H-STO
split of IMDB (``models/imdb/h_sto.toml``):

1. tokens processed per training epoch (batch 128) and per predictive pass over the test split,
   plain against grouped, next to the real (unpadded) token count;
2. the mean time of the SVI step of ``probtrans fit`` (H-STO, delta guide, Trace_ELBO, Adam) over
   the first ``--steps`` batches of one shuffled epoch, plain against grouped, in one run.

Needs the IMDB data: ``PROBTRANS_DATA_DIR`` (local copies) or the Hugging Face hub.

    python benchmarks/length_grouping.py            # about 2 minutes on a 2-core CPU
"""

from __future__ import annotations

import argparse
import platform
import time
from pathlib import Path

import pyro
import torch
from pyro.infer import Trace_ELBO

from probtrans.classifier import build_classifier
from probtrans.data import DataSplit, load_data
from probtrans.inference.guide_builder import build_guide
from probtrans.inference.objective import self_guided
from probtrans.resolve import load_model_spec
from probtrans.runtime.stopwatch import duration
from probtrans.specs import GuideSpec

SPEC = Path(__file__).resolve().parents[1] / "models" / "imdb" / "h_sto.toml"
BATCH = 128


def processed_tokens(split: DataSplit, batch_size: int, shuffle: bool, by_length: bool) -> int:
    generator = torch.Generator().manual_seed(0)
    batches = split.batches(batch_size, shuffle=shuffle, generator=generator, by_length=by_length)
    return sum(inputs.numel() for _, inputs, _, _ in batches)


def mean_step_seconds(split: DataSplit, classifier, steps: int, by_length: bool) -> float:
    """Mean seconds of the SVI step over the first ``steps`` batches of a shuffled epoch."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    model = self_guided(classifier)
    guide = build_guide(classifier, GuideSpec(name="delta"), split)
    params = list(classifier.parameters()) + list(guide.parameters())
    optimizer = torch.optim.Adam(params, lr=1e-3)
    elbo = Trace_ELBO()
    generator = torch.Generator().manual_seed(0)
    batches = split.batches(BATCH, shuffle=True, generator=generator, by_length=by_length)
    seconds = []
    for step, (index, inputs, mask, labels) in enumerate(batches):
        if step == steps + 1:
            break
        start = time.perf_counter()
        optimizer.zero_grad()
        loss = elbo.differentiable_loss(model, guide, inputs, mask, labels, index, len(split))
        loss.backward()
        optimizer.step()
        if step > 0:  # the first step warms up
            seconds.append(time.perf_counter() - start)
    return sum(seconds) / len(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="timed SVI steps per mode")
    args = parser.parse_args()
    spec = load_model_spec(SPEC)
    data = load_data(spec.data)
    print(
        f"{platform.processor() or platform.machine()}, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; IMDB (H-STO split), max_len {spec.data.max_len}"
    )

    print("\ntokens processed (millions)        plain   grouped      real")
    for name, split, shuffle in [
        ("training epoch, batch 128", data.train, True),
        ("predictive pass over test", data.test, False),
    ]:
        plain = processed_tokens(split, BATCH, shuffle, by_length=False)
        grouped = processed_tokens(split, BATCH, shuffle, by_length=True)
        real = int(split.lengths().sum())
        print(
            f"  {name:30s} {plain / 1e6:8.2f} {grouped / 1e6:9.2f} {real / 1e6:9.2f}"
            f"   grouped / plain {grouped / plain:.2f}"
        )

    classifier = build_classifier(spec, data)
    plain = mean_step_seconds(data.train, classifier, args.steps, by_length=False)
    classifier = build_classifier(spec, data)
    grouped = mean_step_seconds(data.train, classifier, args.steps, by_length=True)
    print(f"\nH-STO SVI step, batch {BATCH}, mean of {args.steps} steps")
    print(f"  plain batches     {duration(plain):>9}")
    print(f"  grouped batches   {duration(grouped):>9}")
    print(f"  grouped / plain   {grouped / plain:6.2f}×")


if __name__ == "__main__":
    main()
