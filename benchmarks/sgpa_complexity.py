"""Time one forward + backward pass of an attention layer as the sequence length T grows.

Softmax attention, decoupled SGPA (``sgpa``) and standard SGPA (``sgpa_standard``) on the same
random input (B, T, D); prints the median time per pass for every T, the growth exponent p of
time ∝ T^p fitted by least squares on log time vs log T, and each layer's time relative to
softmax attention. Chen & Li (ICLR 2023, Table 1): decoupled SGPA costs O(B T² M_g + M_g³),
standard SGPA O(B T³), softmax O(B T²).

    python benchmarks/sgpa_complexity.py                 # T = 32 … 1024
    python benchmarks/sgpa_complexity.py --lengths 32 64 128 256 512 --threads 2

Exponents are fitted on the lengths ≥ ``--fit-from`` (default 128), because at short lengths
fixed per-call overheads, not the T² or T³ terms, dominate the time; the exponent of the last
doubling of T is printed too. Measured exponents approach the asymptotic ones from below: BLAS
and LAPACK run larger matrices more efficiently.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from pyro import poutine

from probtrans.nn import SGPAttention, SoftmaxAttention, StandardSGPAttention

KINDS = ("softmax", "sgpa", "sgpa_standard")


def attention_layer(kind: str, d_model: int, n_heads: int, n_inducing: int) -> torch.nn.Module:
    if kind == "softmax":
        return SoftmaxAttention(d_model, n_heads)
    gp = {"kernel": "ard", "lengthscale": 1.0, "outputscale": 1.0}
    if kind == "sgpa":
        return SGPAttention(d_model, n_heads, n_inducing=n_inducing, **gp)
    return StandardSGPAttention(d_model, n_heads, **gp)


def time_pass(layer: torch.nn.Module, x: torch.Tensor, repeats: int) -> float:
    """Median seconds of forward + backward of ``layer(x).sum()`` over ``repeats`` runs."""
    times = []
    for _ in range(repeats + 1):  # the first run warms up
        layer.zero_grad(set_to_none=True)
        start = time.perf_counter()
        with poutine.block():  # Pyro sites are drawn, as in training, but recorded nowhere
            out = layer(x)
        out.sum().backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def growth_exponent(lengths: list[int], seconds: list[float]) -> float:
    """Slope p of log(seconds) = p log(T) + c."""
    return float(np.polyfit(np.log(lengths), np.log(seconds), 1)[0])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", type=int, nargs="+", default=[32, 64, 128, 256, 512, 1024])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--inducing", type=int, default=16, help="M_g of decoupled SGPA")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--fit-from", type=int, default=128, help="smallest T in the fit")
    parser.add_argument("--reference", type=int, default=256, help="T of the time ratios")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    print(
        f"one forward+backward pass, B = {args.batch}, D = {args.d_model}, H = {args.heads}, "
        f"M_g = {args.inducing}, {args.threads} CPU thread(s), median of {args.repeats} runs"
    )
    print(f"{'T':>6}" + "".join(f"{kind:>16}" for kind in KINDS) + "   (milliseconds)")
    seconds: dict[str, list[float]] = {kind: [] for kind in KINDS}
    for length in args.lengths:
        x = torch.randn(args.batch, length, args.d_model)
        for kind in KINDS:
            layer = attention_layer(kind, args.d_model, args.heads, args.inducing)
            seconds[kind].append(time_pass(layer, x, args.repeats))
        print(f"{length:>6}" + "".join(f"{seconds[k][-1] * 1e3:>16.2f}" for k in KINDS))

    fitted = [i for i, length in enumerate(args.lengths) if length >= args.fit_from]
    lengths = [args.lengths[i] for i in fitted]
    last = args.lengths[-2:]
    print(f"\ngrowth exponent p (time ∝ T^p): fitted on T = {lengths} | on T = {last}")
    for kind in KINDS:
        exponent = growth_exponent(lengths, [seconds[kind][i] for i in fitted])
        tail = growth_exponent(last, seconds[kind][-2:])
        print(f"  {kind:<14} {exponent:5.2f} | {tail:5.2f}")
    if args.reference in args.lengths:
        i = args.lengths.index(args.reference)
        print(f"\ntime relative to softmax attention at T = {args.reference}:")
        for kind in KINDS[1:]:
            print(f"  {kind:<14} {seconds[kind][i] / seconds['softmax'][i]:6.1f}×")


if __name__ == "__main__":
    main()
