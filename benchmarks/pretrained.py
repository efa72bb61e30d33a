"""Cost of Bayesian fine-tuning of a pretrained backbone against plain fine-tuning, on the CPU.

The backbone is BERT-base in size (``BertConfig`` defaults: width 768, 12 layers, 12 heads, MLP
3072, vocabulary 30522, about 110 M parameters) with random weights (the cost of a step does not
depend on their values), on random token ids: batch 16, sequence length 128, two classes. The
configurations are each a :class:`probtrans.classifier.BackboneClassifier` built directly from a
``NetworkSpec`` and the model (no hub, no tokenizer); everything runs in one invocation.

1. **plain fine-tuning**: no swap, no priors; the step is written in plain PyTorch over the
   classifier's modules (backbone, [CLS] pooling, dropout, linear head): forward,
   cross-entropy, backward, ``torch.optim.Adam`` over every weight (the whole backbone trains).
2. **plain LoRA**: as 1., the backbone frozen and LoRA adapters r = 8 on ``query`` and
   ``value`` (no priors): Adam over the adapters and the head. SVI against it is the cost of
   the Bayesian parts (SGPA, the guide, the ELBO) alone.
3. **probtrans SVI**: SGPA swapped into the top 2 self-attention blocks (``[model.swap]``
   ``attention = { kind = "sgpa" }``, its defaults), ``[model.prior] weights = "lora"`` with
   r = 8 on ``query`` and ``value`` (the backbone frozen, Normal priors on the adapters and the
   head), and the inference spec ``inference/mfvi.toml`` (mean-field Normal guide, Cholesky
   guide of SGPA's inducing variables, analytic KL): the step of ``probtrans fit``
   (``SVITraining``: the self-guided model and the guide under the KL weight, Trace_ELBO
   differentiable loss, backward, Adam step, learning-rate schedule step).

Each configuration runs in its own process (the script calls itself with ``--case``), so the
peaks do not mix. Times are medians over ``--steps`` steps after one warm-up step. "step peak"
is the peak resident memory (``VmHWM`` of ``/proc/self/status``, reset through
``/proc/self/clear_refs`` once the model, optimiser and batch are built; where that reset is
refused, ``getrusage``'s ``ru_maxrss``) above the resident memory at that point: what the steps
add (activations, gradients, the optimiser's moments, first allocated in the warm-up step).
"process peak" is the process's whole peak resident memory.

    python benchmarks/pretrained.py                     # a few minutes on a 2-core CPU
    python benchmarks/pretrained.py --steps 3 --layers 4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
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

ROOT = Path(__file__).resolve().parents[1]
INFERENCE = ROOT / "inference" / "mfvi.toml"
CLASSES = 2
N_TRAIN = 8_551  # CoLA's training set: the likelihood's scale N / B in the ELBO
CASES = {
    "plain": "plain fine-tuning (PyTorch, Adam)",
    "lora": "plain LoRA r = 8 (PyTorch, Adam)",
    "svi": "SVI: SGPA top 2 + LoRA r = 8, MFVI",
}


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def reset_peak() -> bool:
    """Reset this process's peak resident memory (Linux ≥ 4.0); False where refused."""
    try:
        with open("/proc/self/clear_refs", "w") as clear:
            clear.write("5")
        return True
    except OSError:
        return False


def peak_mib(reset: bool) -> float:
    """The peak resident memory since the reset (or since the process started)."""
    if reset:
        status = Path("/proc/self/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+)", status).group(1)) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def process_peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def backbone(args: argparse.Namespace) -> torch.nn.Module:
    """A BERT (``AutoModel``: no task head) of the benchmark's sizes, random weights."""
    from transformers import BertConfig, BertModel

    config = BertConfig(
        hidden_size=args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        intermediate_size=4 * args.hidden,
        max_position_embeddings=max(512, args.length),
    )
    return BertModel(config)  # attention: PyTorch's SDPA, transformers' default


def network(case: str, layers: int):  # -> NetworkSpec
    from probtrans.specs import NetworkSpec

    if case == "plain":
        return NetworkSpec(backbone="bert-base", pooling="cls")
    top = list(range(-min(2, layers), 0))
    return NetworkSpec.model_validate(
        {
            "backbone": "bert-base",
            "pooling": "cls",
            "swap": {"layers": top, "attention": {"kind": "sgpa"}},
            "prior": {"weights": "lora", "lora": {"r": 8, "targets": ["query", "value"]}},
        }
    )


def batch(args: argparse.Namespace, vocab: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (args.batch, args.length), generator=generator)
    ids[:, 0] = 101  # [CLS]
    mask = torch.ones_like(ids, dtype=torch.bool)
    labels = torch.randint(CLASSES, (args.batch,), generator=generator)
    return ids, mask, labels


def plain_step(args: argparse.Namespace, lora: bool = False) -> Callable[[], None]:
    """Fine-tuning in plain PyTorch through the classifier's modules (no Pyro): of every
    weight, or (``lora``) of LoRA adapters r = 8 on the query and value maps of the frozen
    backbone and the head, without priors."""
    from probtrans.backbone.lora import add_lora
    from probtrans.classifier import BackboneClassifier

    classifier = BackboneClassifier(network("plain", args.layers), backbone(args), CLASSES, False)
    if lora:
        classifier.backbone.requires_grad_(False)
        add_lora(classifier.backbone, ["query", "value"], 8, 16.0)
    classifier.train()
    ids, mask, labels = batch(args, classifier.backbone.config.vocab_size)
    trained = [p for p in classifier.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trained, lr=2e-5)

    def step() -> None:
        optimizer.zero_grad()
        features = classifier.feature_map(classifier.encode(ids, mask))
        F.cross_entropy(classifier.head(features), labels).backward()
        optimizer.step()

    return step


def svi_step(args: argparse.Namespace) -> Callable[[], None]:
    """The SVI step of ``probtrans fit`` (:class:`probtrans.inference.train.SVITraining`)."""
    from probtrans.classifier import BackboneClassifier
    from probtrans.data import DataBundle, DataSplit
    from probtrans.inference.train import SVITraining
    from probtrans.resolve import load_inference_spec

    classifier = BackboneClassifier(network("svi", args.layers), backbone(args), CLASSES, False)
    vocab = classifier.backbone.config.vocab_size
    ids, mask, labels = batch(args, vocab)
    split = DataSplit(ids, labels, mask)
    data = DataBundle("synthetic", split, split, split, {}, ["neg", "pos"], "tokens", None, vocab)
    training = SVITraining(classifier, data, load_inference_spec(INFERENCE), 0, "cpu")
    training.objective.n_data = N_TRAIN
    training.kl_weight.annealing = 1.0
    index = torch.arange(args.batch)
    classifier.train()

    def step() -> None:
        training.optimizer.zero_grad()
        loss, _ = training.loss(index, ids, mask, labels)
        loss.backward()
        training.optimizer.step()
        training.schedule.step()

    return step


def run_case(case: str, args: argparse.Namespace) -> dict[str, float]:
    """One configuration in this process: its median step time and peak memory."""
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    step = svi_step(args) if case == "svi" else plain_step(args, lora=case == "lora")
    before = rss_mib()
    reset = reset_peak()
    times = []
    for _ in range(args.steps + 1):  # the first step warms up (and allocates Adam's moments)
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {
        "seconds": statistics.median(times[1:]),
        "step_peak_mib": max(0.0, peak_mib(reset) - before),
        "process_peak_mib": process_peak_mib(),
        "peak_reset": reset,
    }


def measure(case: str, args: argparse.Namespace) -> dict[str, float]:
    """Run one configuration in a fresh process, so that its peak memory is its own."""
    command = [sys.executable, __file__, "--case", case, *sizes(args)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def sizes(args: argparse.Namespace) -> list[str]:
    options = ("steps", "batch", "length", "layers", "hidden", "heads")
    return [word for name in options for word in (f"--{name}", str(getattr(args, name)))]


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5, help="timed steps after one warm-up")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128, help="tokens per sequence")
    parser.add_argument("--layers", type=int, default=12, help="transformer blocks")
    parser.add_argument("--hidden", type=int, default=768, help="width (MLP: 4 × width)")
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--case", choices=list(CASES), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in ("steps", "batch", "length", "layers", "hidden", "heads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    if args.hidden % args.heads:
        parser.error(f"--heads {args.heads} must divide --hidden {args.hidden}")
    return args


def main(argv: list[str] | None = None) -> dict[str, dict[str, float]]:
    args = parse(argv)
    if args.case:
        print(json.dumps(run_case(args.case, args)))
        return {}
    threads = os.environ.get("OMP_NUM_THREADS")
    print(
        f"{cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} threads"
        + (f" (OMP_NUM_THREADS={threads})" if threads else "")
        + f", median of {args.steps} steps after 1 warm-up"
    )
    print(
        f"BERT: width {args.hidden}, {args.layers} layers, {args.heads} heads, MLP "
        f"{4 * args.hidden}, vocabulary 30522; batch {args.batch}, length {args.length}\n"
    )
    print(f"  {'configuration':<38} {'step':>8}  {'step peak':>10}  {'process peak':>12}")
    results = {}
    for case, label in CASES.items():
        results[case] = result = measure(case, args)
        print(
            f"  {label:<38} {result['seconds']:7.3f}s  {result['step_peak_mib']:6.0f} MiB  "
            f"{result['process_peak_mib']:8.0f} MiB",
            flush=True,
        )
    svi, plain = results["svi"], results["plain"]
    if not (svi["peak_reset"] and plain["peak_reset"]):
        print("  (the peak could not be reset: step peaks are process peaks above the start)")
    print("\nratios, SVI / plain (one run):")
    print(f"  {'step time (goal ≤ 1.5×)':<38} {svi['seconds'] / plain['seconds']:5.2f}×")
    step_ratio = svi["step_peak_mib"] / max(plain["step_peak_mib"], 1.0)
    print(f"  {'step peak memory (goal ≤ 1.3×)':<38} {step_ratio:5.2f}×")
    process_ratio = svi["process_peak_mib"] / plain["process_peak_mib"]
    print(f"  {'process peak memory':<38} {process_ratio:5.2f}×")
    lora = results["lora"]
    print("\nSVI / plain LoRA (the cost of the Bayesian parts alone):")
    print(f"  {'step time':<38} {svi['seconds'] / lora['seconds']:5.2f}×")
    lora_ratio = svi["step_peak_mib"] / max(lora["step_peak_mib"], 1.0)
    print(f"  {'step peak memory':<38} {lora_ratio:5.2f}×")
    return results


if __name__ == "__main__":
    main()
