"""Training throughput (examples/s) of data-parallel SVI, printed as ratios measured in one run.

The IMDB H-STO model (``models/imdb/h_sto.toml`` with ``inference/imdb/map.toml``: batch 128)
and the IMDB SGPA model (``models/imdb/sgpa.toml`` with ``inference/imdb/sgpa.toml``: batch 32)
train on random token ids of ``--length`` tokens (the timings do not depend on the words), by
the training loop of ``probtrans fit`` (:class:`probtrans.inference.train.SVITraining`):

- on CPU, 1 and 2 processes of 1 thread each (2 under ``torchrun``: ``DistributedDataParallel``,
  gloo), and 1 process of 2 threads: on a 2-core machine, 2 processes × 1 thread against
  1 process × 2 threads uses the same cores either way and is the fair comparison, printed last;
- on a GPU when there is one: 1 process in fp32 against bf16 autocast (``[train] precision``).

Each configuration runs in fresh processes: one epoch of ``--steps`` global batches warms up,
the next is timed; examples/s counts every process's rows.

    python benchmarks/scaling.py                   # about 3 minutes on a 2-core CPU
    python benchmarks/scaling.py --steps 8 --length 512
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from probtrans.classifier import build_classifier
from probtrans.data import DataBundle
from probtrans.inference.train import SVITraining
from probtrans.resolve import load_inference_spec, load_model_spec
from probtrans.runtime import distributed
from probtrans.specs import updated

ROOT = Path(__file__).resolve().parents[1]
#: model → (model spec, inference spec)
MODELS = {
    "h_sto": ("models/imdb/h_sto.toml", "inference/imdb/map.toml"),
    "sgpa": ("models/imdb/sgpa.toml", "inference/imdb/sgpa.toml"),
}
VOCAB = 20000


def token_data(rows: int, length: int) -> DataBundle:
    """``rows`` random reviews of ``length`` tokens (no padding), two classes."""
    generator = torch.Generator().manual_seed(0)

    def split(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids = torch.randint(1, VOCAB, (n, length), generator=generator)
        return ids, torch.arange(n) % 2

    return DataBundle.from_tensors(split(rows), split(8), split(8), vocab_size=VOCAB)


def throughput(model: str, steps: int, length: int, device: str, precision: str) -> float:
    """Examples per second of one timed epoch of ``steps`` global batches, on every process of
    the current process group together."""
    model_path, inference_path = (ROOT / p for p in MODELS[model])
    spec = load_inference_spec(inference_path)
    spec = updated(spec, {"train.precision": precision}, "benchmark")
    rows = spec.train.batch_size * steps
    data = token_data(rows, length)
    torch.manual_seed(0)
    classifier = build_classifier(load_model_spec(model_path), data).to(device)
    svi = SVITraining(classifier, data, spec, seed=0, device=device)
    svi.epoch(1, progress=False)  # warm-up
    distributed.current().barrier()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    svi.epoch(2, progress=False)
    if device == "cuda":
        torch.cuda.synchronize()
    return rows / (time.perf_counter() - start)


def worker(args: argparse.Namespace) -> None:
    """One process of a configuration; rank 0 prints its examples/s as JSON."""
    torch.set_num_threads(args.threads)
    with distributed.process_group(args.device) as processes:
        value = throughput(args.model, args.steps, args.length, args.device, args.precision)
        if processes.is_main:
            print(json.dumps({"examples_per_second": value}), flush=True)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure(
    model: str, processes: int, threads: int, device: str, precision: str, args: argparse.Namespace
) -> float:
    """Examples/s of ``processes`` fresh processes of ``threads`` threads each."""
    worker_args = [
        str(Path(__file__).resolve()),
        "--worker",
        "--model",
        model,
        "--threads",
        str(threads),
        "--device",
        device,
        "--precision",
        precision,
        "--steps",
        str(args.steps),
        "--length",
        str(args.length),
    ]
    launcher = [sys.executable]
    if processes > 1:
        launcher += ["-m", "torch.distributed.run", "--nproc_per_node", str(processes)]
        launcher += ["--master_addr", "127.0.0.1", "--master_port", str(free_port())]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "GLOO_SOCKET_IFNAME": "lo"}
    done = subprocess.run(
        [*launcher, *worker_args], env=env, capture_output=True, text=True, check=False
    )
    if done.returncode != 0:
        sys.exit(f"scaling: {model} on {processes} processes failed:\n{done.stderr[-2000:]}")
    result = [line for line in done.stdout.splitlines() if line.startswith("{")][-1]
    return json.loads(result)["examples_per_second"]


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    text = f"{os.cpu_count()} CPU cores ({cpu}), torch {torch.__version__}"
    if torch.cuda.is_available():
        text += f", {torch.cuda.get_device_name()}"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=4, help="global batches per timed epoch")
    parser.add_argument("--length", type=int, default=256, help="tokens per review")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--model", choices=MODELS, help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    parser.add_argument("--precision", default="fp32", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    print(f"{machine()}; {args.steps} batches of {args.length} tokens timed per configuration")
    print(f"{'model':7} {'configuration':34} {'examples/s':>10} {'ratio':>6}")
    for model in MODELS:
        cpu = [
            ("1 process × 1 thread, CPU", measure(model, 1, 1, "cpu", "fp32", args)),
            ("2 processes × 1 thread, CPU (DDP)", measure(model, 2, 1, "cpu", "fp32", args)),
            ("1 process × 2 threads, CPU", measure(model, 1, 2, "cpu", "fp32", args)),
        ]
        gpu = []
        if torch.cuda.is_available():
            gpu = [
                ("1 process, GPU, fp32", measure(model, 1, 1, "cuda", "fp32", args)),
                ("1 process, GPU, bf16 autocast", measure(model, 1, 1, "cuda", "bf16", args)),
            ]
        for rows in (cpu, gpu):
            for name, value in rows:
                print(f"{model:7} {name:34} {value:10.1f} {value / rows[0][1]:6.2f}")
        fair = cpu[1][1] / cpu[2][1]
        print(f"{model:7} {'2 processes × 1 thread / 1 process × 2 threads':45} {fair:6.2f}")


if __name__ == "__main__":
    main()
