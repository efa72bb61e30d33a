"""Each path of ``probtrans.runtime.paths`` timed on one device: the measurements its
``MEASURED`` table is chosen from.

One attention layer, forward and backward, width 128, 8 heads (H-STO's IMDB scale), at a few
batch sizes B and sequence lengths T:

- decoupled SGPA (ARD kernel, M_g = 16): the ``float64`` conditional, and the ``factored`` one
  with chunks of 2¹⁶ to 2²⁶ T × T elements (``residual_chunk``);
- STO and H-STO where their sites are hidden (as in training): the ``fused`` kernel and the
  ``sites`` path.

Each time is the median of ``--repeats`` runs after warm-up (``speed.median_seconds``); every
case runs in this one process, in turn. Each group's fastest is marked ``*`` and the path that
``MEASURED`` takes on this device with ``<``, with its time over the fastest's.

    python benchmarks/paths.py                  # 2-core CPU: about 5 min
    python benchmarks/paths.py --device cuda    # about 100 s on an H200
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

import pyro
import torch
import torch.nn.functional as F
from pyro import poutine
from speed import cpu_name, median_seconds

from probtrans.contract import fused_attention
from probtrans.nn import HierarchicalStochasticAttention, SGPAttention, StochasticAttention
from probtrans.runtime.paths import paths_for, use_paths
from probtrans.runtime.stopwatch import duration

WIDTH, HEADS = 128, 8
#: (B, T): H-STO's IMDB batch, IMDB SGPA's training batch, many short sequences
SIZES = ((128, 256), (32, 512), (128, 64))
CHUNKS = tuple(1 << k for k in (16, 18, 20, 22, 24, 26))


def layer_step(layer: torch.nn.Module, batch: int, length: int, device: str, **paths):
    """Forward and backward of ``layer`` on (batch, length, WIDTH) inputs under ``paths``, its
    sites hidden."""
    layer.to(device)
    x = F.layer_norm(torch.randn(batch, length, WIDTH, device=device), (WIDTH,))
    x.requires_grad_()

    def step() -> None:
        layer.zero_grad(set_to_none=True)
        with poutine.block(), fused_attention(), use_paths(**paths):
            out = layer(x)
        out.sum().backward()

    return step


def groups(batch: int, length: int, device: str) -> dict[str, dict[str, Callable[[], None]]]:
    """Each computation's paths: label → step."""
    sgpa = SGPAttention(WIDTH, HEADS, n_inducing=16, kernel="ard")
    paths = {"float64": layer_step(sgpa, batch, length, device, sgpa_conditional="float64")}
    for chunk in CHUNKS:
        paths[factored_label(chunk)] = layer_step(
            sgpa, batch, length, device, sgpa_conditional="factored", residual_chunk=chunk
        )
    table = {"SGPA": paths}
    for name, layer in (
        ("STO", StochasticAttention(WIDTH, HEADS, tau=40.0)),
        ("H-STO", HierarchicalStochasticAttention(WIDTH, HEADS)),
    ):
        table[name] = {
            path: layer_step(layer, batch, length, device, attention=path)
            for path in ("fused", "sites")
        }
    return table


def measured_label(group: str, device: str) -> str:
    """The label of the path ``MEASURED`` takes in ``group`` on ``device``."""
    chosen = paths_for(device)
    if group != "SGPA":
        return chosen.attention
    if chosen.sgpa_conditional == "float64":
        return "float64"
    return factored_label(chosen.residual_chunk)


def factored_label(chunk: int) -> str:
    """The label of the factored conditional in chunks of ``chunk`` (a power of 2) elements."""
    return f"factored, chunk 2^{chunk.bit_length() - 1}"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device on this machine")
    gpu = f"{torch.cuda.get_device_name()} on " if args.device == "cuda" else ""
    print(
        f"{gpu}{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads; forward + backward, width {WIDTH}, {HEADS} heads"
    )
    print(f"MEASURED on {args.device}: {paths_for(args.device)}")
    for batch, length in SIZES:
        print(f"\nB = {batch}, T = {length}")
        for group, steps in groups(batch, length, args.device).items():
            pyro.set_rng_seed(0)
            times = {
                label: median_seconds(step, args.repeats, args.device)
                for label, step in steps.items()
            }
            fastest, chosen = min(times, key=times.get), measured_label(group, args.device)
            for label, seconds in times.items():
                marks = ("*" if label == fastest else " ") + ("<" if label == chosen else " ")
                print(f"  {group:<6} {label:<22} {duration(seconds):>9} {marks}")
            print(f"  {group:<6} MEASURED's / fastest: {times[chosen] / times[fastest]:.2f}×")


if __name__ == "__main__":
    main()
