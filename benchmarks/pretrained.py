"""Cost of Bayesian fine-tuning of a pretrained backbone against plain fine-tuning, on the CPU
or (``--device cuda``) a GPU.

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
"process peak" is the process's whole peak resident memory. With ``--device cuda`` the models
and optimisers are on the GPU, each step moves its batch there (probtrans as ``fit`` does, the
plain loops as a training loop does), the clock is read after ``torch.cuda.synchronize()``, and
"step peak" is the peak allocated GPU memory above what was allocated once the model was built;
every configuration then runs in this one process.

    python benchmarks/pretrained.py                     # a few minutes on a 2-core CPU
    python benchmarks/pretrained.py --steps 3 --layers 4

**A compare preset** (``--preset``, e.g. ``results/presets/minilm_cola.toml``, the real
all-MiniLM-L6-v2 from PyPI): the training step of each of its trainings (methods that differ
only in their predictive — a post-hoc variant, temperature scaling, an ensemble — share one),
as ``probtrans fit`` takes it (:meth:`~probtrans.inference.train.SVITraining.training_loss`,
backward, the optimiser's and the schedule's steps) on random token ids of ``--length`` in
batches of ``--batch``, against the plain loop a ``transformers`` user writes for the preset's
backbone: ``AutoModelForSequenceClassification``, every weight, ``torch.optim.AdamW``. Each
step's time, its ratio to the plain loop's, and an epoch of ``--examples`` training examples at
that rate (the steps alone: validation passes and data loading are not in it)::

    python benchmarks/pretrained.py --preset results/presets/minilm_cola.toml --batch 32 --length 32
"""

from __future__ import annotations

import argparse
import gc
import json
import math
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

from probtrans.runtime.stopwatch import duration

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
    classifier.to(args.device).train()
    ids, mask, labels = batch(args, classifier.backbone.config.vocab_size)
    trained = [p for p in classifier.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trained, lr=2e-5)

    def step() -> None:
        optimizer.zero_grad()
        x, m, y = (t.to(args.device) for t in (ids, mask, labels))  # the batch, as a loop moves it
        features = classifier.feature_map(classifier.encode(x, m))
        F.cross_entropy(classifier.head(features), y).backward()
        optimizer.step()

    return step


def svi_step(args: argparse.Namespace) -> Callable[[], None]:
    """The SVI step of ``probtrans fit`` (:class:`probtrans.inference.train.SVITraining`)."""
    from probtrans.classifier import BackboneClassifier
    from probtrans.resolve import load_inference_spec

    classifier = BackboneClassifier(network("svi", args.layers), backbone(args), CLASSES, False)
    data = synthetic_bundle(args, classifier.backbone.config.vocab_size)
    return fit_step(classifier, data, load_inference_spec(INFERENCE), args)


def fit_step(classifier, data, inference, args: argparse.Namespace) -> Callable[[], None]:
    """The training step of ``probtrans fit`` on the one batch of ``data``: the loss as a step
    takes it (:meth:`~probtrans.inference.train.SVITraining.training_loss`, the KL at full
    weight, the likelihood scaled to ``--examples``), backward, the optimiser's and the
    schedule's steps."""
    from probtrans.inference.train import SVITraining

    classifier.to(args.device)  # as train_classifier does; each batch moves as fit moves it
    training = SVITraining(classifier, data, inference, 0, args.device)
    training.objective.n_data = args.examples
    training.kl_weight.annealing = 1.0
    split, index = data.train, torch.arange(args.batch)
    classifier.train()

    def step() -> None:
        training.optimizer.zero_grad()
        loss, _ = training.training_loss(index, split.inputs, split.mask, split.labels)
        loss.backward()
        training.optimizer.step()
        training.schedule.step()

    return step


PLAIN_LOOP = "transformers"


def preset_trainings(preset: str) -> dict[str, tuple[str, str, str]]:
    """The trainings of a compare preset, ``t0``, ``t1``, ...: (the first of its methods' names,
    model spec, inference spec)."""
    from probtrans.runs.compare import load_preset

    trainings: dict[tuple[str, str], str] = {}
    for method in load_preset(preset).method:
        trainings.setdefault((method.model, method.inference), method.name)
    return {f"t{i}": (name, *files) for i, (files, name) in enumerate(trainings.items())}


def synthetic_bundle(args: argparse.Namespace, vocab: int):  # -> DataBundle
    """One batch of random token ids as every split of a two-class data set."""
    from probtrans.data import DataBundle, DataSplit

    ids, mask, labels = batch(args, vocab)
    split = DataSplit(ids, labels, mask)
    return DataBundle("synthetic", split, split, split, {}, ["neg", "pos"], "tokens", None, vocab)


def preset_step(args: argparse.Namespace, case: str) -> Callable[[], None]:
    """The training step of one of the preset's trainings, or of the plain ``transformers``
    loop over its first training's backbone (``case`` :data:`PLAIN_LOOP`)."""
    from probtrans.classifier import build_classifier
    from probtrans.resolve import load_inference_spec, load_model_spec, with_local_backbone

    trainings = preset_trainings(args.preset)
    _, model_file, inference_file = trainings["t0" if case == PLAIN_LOOP else case]
    spec, backbone = with_local_backbone(load_model_spec(model_file))
    if backbone is None:
        sys.exit(f"pretrained.py --preset: {model_file} names no model.backbone")
    data = synthetic_bundle(args, backbone.config.vocab_size)
    if case == PLAIN_LOOP:
        from transformers import AutoModelForSequenceClassification

        ids, mask, labels = data.train.inputs, data.train.mask, data.train.labels
        model = AutoModelForSequenceClassification.from_pretrained(backbone.folder, num_labels=2)
        model.to(args.device).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)

        def plain() -> None:
            optimizer.zero_grad()
            x, m, y = (t.to(args.device) for t in (ids, mask.long(), labels))  # as a loop moves it
            model(input_ids=x, attention_mask=m, labels=y).loss.backward()
            optimizer.step()

        return plain
    inference = load_inference_spec(inference_file)
    return fit_step(build_classifier(spec, data, backbone), data, inference, args)


def preset_table(args: argparse.Namespace) -> dict[str, dict[str, float]]:
    """Every training of ``--preset`` and the plain loop, each in its own process: the table."""
    trainings = preset_trainings(args.preset)
    labels = {PLAIN_LOOP: "transformers loop (every weight, AdamW)"}
    labels |= {case: name for case, (name, _, _) in trainings.items()}
    steps_per_epoch = math.ceil(args.examples / args.batch)
    print(
        f"preset {args.preset}: batch {args.batch}, length {args.length}; an epoch of "
        f"{args.examples} examples = {steps_per_epoch} steps\n"
    )
    print(f"  {'training':<42} {'step':>8}  {'epoch':>8}  {'/ loop':>6}  {'step peak':>10}")
    results = {}
    for case, label in labels.items():
        results[case] = result = measure(case, args)
        ratio = result["seconds"] / results[PLAIN_LOOP]["seconds"]
        print(
            f"  {label:<42} {duration(result['seconds']):>8}  "
            f"{duration(steps_per_epoch * result['seconds']):>8}  {ratio:5.2f}×  "
            f"{result['step_peak_mib']:6.0f} MiB",
            flush=True,
        )
    return results


def run_case(case: str, args: argparse.Namespace) -> dict[str, float]:
    """One configuration in this process: its median step time and peak memory."""
    torch.manual_seed(0)
    pyro.set_rng_seed(0)
    if args.preset:
        step = preset_step(args, case)
    else:
        step = svi_step(args) if case == "svi" else plain_step(args, lora=case == "lora")
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated() / 2**20 if cuda else rss_mib()
    reset = reset_peak()
    times = []
    for _ in range(args.steps + 1):  # the first step warms up (and allocates Adam's moments)
        start = time.perf_counter()
        step()
        if cuda:
            torch.cuda.synchronize()  # wait for the step's kernels
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated() / 2**20 if cuda else peak_mib(reset)
    return {
        "seconds": statistics.median(times[1:]),
        "step_peak_mib": max(0.0, peak - before),
        "process_peak_mib": process_peak_mib(),
        "peak_reset": reset,
    }


def measure(case: str, args: argparse.Namespace) -> dict[str, float]:
    """Run one configuration: on the CPU in a fresh process, so that its peak memory is its
    own; on a GPU in this process, whose peak allocated memory is reset per configuration (a
    fresh process took some 20 s a configuration on an H200)."""
    if args.device == "cuda":
        pyro.clear_param_store()
        result = run_case(case, args)
        gc.collect()  # the configuration's model and optimiser, before the next one's peak
        torch.cuda.empty_cache()
        return result
    command = [sys.executable, __file__, "--case", case, *sizes(args)]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def sizes(args: argparse.Namespace) -> list[str]:
    options = ("steps", "batch", "length", "layers", "hidden", "heads", "examples", "device")
    words = [word for name in options for word in (f"--{name}", str(getattr(args, name)))]
    return words + (["--preset", args.preset] if args.preset else [])


def machine(args: argparse.Namespace) -> str:
    """The processor, and the GPU with ``--device cuda``."""
    gpu = f"{torch.cuda.get_device_name()} on " if args.device == "cuda" else ""
    return f"{gpu}{cpu_name()}, {os.cpu_count()} cores"


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
    parser.add_argument(
        "--preset", help="a compare preset: time each of its trainings against a plain loop"
    )
    parser.add_argument(
        "--examples",
        type=int,
        default=N_TRAIN,
        help=f"training examples: the ELBO's N / B; with --preset, an epoch (default {N_TRAIN})",
    )
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--case", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: no CUDA device on this machine")
    for name in ("steps", "batch", "length", "layers", "hidden", "heads", "examples"):
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
    if args.preset:
        print(
            f"{machine(args)}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, median of {args.steps} steps after 1 warm-up"
        )
        return preset_table(args)
    threads = os.environ.get("OMP_NUM_THREADS")
    print(
        f"{machine(args)}, torch {torch.__version__}, "
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
            f"  {label:<38} {duration(result['seconds']):>8}  {result['step_peak_mib']:6.0f} MiB  "
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
