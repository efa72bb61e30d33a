"""Data-parallel processes on ``torch.distributed``: who this process is, and the few collective
steps a fit needs besides the gradient average (which ``DistributedDataParallel`` does).

``torchrun --nproc_per_node N -m probtrans fit ...`` starts N processes; the command joins them
into one process group (:func:`process_group`: ``gloo`` on CPU, ``nccl`` on CUDA). Rank 0 is the
*main* process: it alone reads and writes the run folder, and shares what the others need
(:meth:`Processes.share`). A Python caller that has initialised a process group itself gets the
same behaviour from :func:`probtrans.fit`, which uses the default group when there is one
(:func:`current`). Without a group, everything here is a no-op for one process.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from probtrans.errors import ProbtransError

T = TypeVar("T")

#: environment variables torchrun sets for every process it starts
TORCHRUN_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")
#: how long a process waits for the others at a collective step (evaluation on rank 0 included)
TIMEOUT = timedelta(hours=2)


@dataclass(frozen=True)
class Processes:
    """This process's place among the data-parallel processes of a fit."""

    rank: int = 0
    size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    def share(self, compute: Callable[[], T]) -> T:
        """``compute()`` on the main process, its result (or its :class:`ProbtransError`, raised
        again) given to every process."""
        if not self.distributed:
            return compute()
        payload: list[Any] = [None]
        if self.is_main:
            try:
                payload[0] = ("value", compute())
            except ProbtransError as err:
                payload[0] = ("error", str(err))
        dist.broadcast_object_list(payload, src=0)
        kind, value = payload[0]
        if kind == "error":
            raise ProbtransError(value)
        return value

    def gather(self, value: T) -> list[T]:
        """Every process's ``value``, by rank, on every process."""
        if not self.distributed:
            return [value]
        values: list[Any] = [None] * self.size
        dist.all_gather_object(values, value)
        return values

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """The sum over processes of ``values`` (a new tensor on every process)."""
        if not self.distributed:
            return values.clone()
        on = "cuda" if dist.get_backend() == "nccl" else "cpu"  # NCCL reduces GPU tensors only
        total = values.to(on, copy=True)
        dist.all_reduce(total)
        return total.to(values.device)

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()

    @contextmanager
    def main_first(self) -> Iterator[None]:
        """Run the block on the main process, then on the others: e.g. data loading that fills
        a cache once, which the others then read."""
        if not self.is_main:
            self.barrier()
        yield
        if self.is_main:
            self.barrier()

    def shard(self, index: torch.Tensor) -> torch.Tensor:
        """This process's part of a global batch ``index``: every ``size``-th row from its rank,
        so rows next to each other (of similar length, when grouped) go to different processes
        and the parts differ in size by at most one."""
        return index[self.rank :: self.size]


def current() -> Processes:
    """The processes of the default process group, or one process when there is none."""
    if dist.is_available() and dist.is_initialized():
        return Processes(dist.get_rank(), dist.get_world_size())
    return Processes()


def launched_by_torchrun() -> bool:
    return all(name in os.environ for name in TORCHRUN_VARIABLES)


@contextmanager
def process_group(device: str) -> Iterator[Processes]:
    """Join the processes torchrun started (``gloo`` on CPU, ``nccl`` on CUDA, each CUDA process
    on its local GPU) for the block, and leave the group afterwards; a process not started by
    torchrun (or already in a group) runs as it is."""
    if not launched_by_torchrun() or dist.is_initialized():
        yield current()
        return
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ProbtransError("--device cuda: no CUDA device is available on this machine")
        local = int(os.environ["LOCAL_RANK"])
        if local >= torch.cuda.device_count():
            raise ProbtransError(
                f"LOCAL_RANK {local}: this machine has {torch.cuda.device_count()} CUDA devices; "
                f"start at most that many processes per machine (torchrun --nproc_per_node)"
            )
        torch.cuda.set_device(local)
        # bound to its GPU, the group's barriers need not guess the device from the rank
        dist.init_process_group("nccl", timeout=TIMEOUT, device_id=torch.device("cuda", local))
    else:
        dist.init_process_group("gloo", timeout=TIMEOUT)
    try:
        yield current()
        # Every process waits here for the others' last collective step to be retired before it
        # leaves: gloo's worker threads release a finished step's tensors after the caller has
        # moved on, and one still doing so when Python shuts down aborts the process (SIGABRT,
        # "terminate called without an active exception"); DistributedDataParallel keeps the
        # group, and so those threads, alive past destroy_process_group. A barrier holds no
        # tensors, and waiting on it lets the threads finish with the previous step.
        dist.barrier()
    finally:
        dist.destroy_process_group()
