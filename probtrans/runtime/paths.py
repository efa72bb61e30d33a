"""Which of two implementations of one computation runs, chosen per device (issue 54).

Each choice is between implementations that compute the same result, to the tolerance their
tests check; only their speed differs, and it differs by device:

- ``sgpa_conditional``: SGPA's decoupled conditional (Chen & Li, ICLR 2023, Eq. 11) with its
  O(T²) remainder in float32 (``"factored"``, :func:`probtrans.gp.decoupled.decoupled_conditional`)
  or with every matrix in float64 (``"float64"``,
  :func:`~probtrans.gp.decoupled.decoupled_conditional_reference`). The same moments to about
  10⁻⁷ relative at the IMDB kernel scales (``tests/test_paths.py``, ``tests/test_sgpa.py``).
- ``residual_chunk``: T × T elements per chunk of the factored path's remainder product
  (:mod:`probtrans.gp.residual`), and elements per float64 intermediate of each piece of whole
  sequences its low-rank parts run on (:func:`probtrans.gp.decoupled.decoupled_conditional`).
  On a CPU a chunk's buffers fit a core's cache, and a piece's float64 intermediates are reused
  from the heap instead of mapped afresh (32 MiB or more) and page-faulted in by every operation;
  on a GPU each chunk or piece costs a handful of kernel launches, so one holds the whole batch
  unless it is very large. Any size gives the same results up to float32 summation order.
- ``attention``: stochastic attention (STO, H-STO) where its sites are hidden
  (:func:`probtrans.contract.fused_attention`) through one fused kernel (``"fused"``) or through
  its Pyro sample sites (``"sites"``): the same sample and gradients from the same noise
  (``tests/test_fused_attention.py``).

:data:`MEASURED` holds the choice per device type, made from ``benchmarks/paths.py``'s timings
at several batch sizes and lengths (the figures and the reasons are beside it); a chunk holds
as many T × T blocks (one per sequence and head) as fit its size. A device type not in it
takes the CPU's. A spec's ``[paths]`` table (:class:`probtrans.specs.inference.PathsSpec`)
overrides any of them: :func:`use_paths` around the work, :func:`paths_for` where the work
asks.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import asdict, dataclass, replace
from typing import Any, Literal

SgpaConditional = Literal["factored", "float64"]
AttentionPath = Literal["fused", "sites"]


@dataclass(frozen=True)
class Paths:
    """One choice of every path (module docstring)."""

    sgpa_conditional: SgpaConditional
    residual_chunk: int  # elements per chunk of the SGPA remainder and per float64 piece
    attention: AttentionPath


#: the path of each pair per device type, from ``benchmarks/paths.py`` (one run per device,
#: 2026-11-28; SGPA with M_g = 16 at (B, T) = (128, 256), (32, 512), (128, 64)):
#: - cpu (this project's 2-core Intel Xeon): the factored conditional, 6.9× and 7.5× faster than
#:   the float64 one at T = 256 and 512 (1.5× at T = 64), in chunks of 2¹⁸ elements (two 1 MiB
#:   buffers, in a core's L2 cache), the fastest at every size: 2²⁰ took up to 1.27× as long,
#:   one chunk of 2²⁶ up to 2.5×;
#: - cuda (one NVIDIA H200): the factored conditional in chunks of 2²⁴ elements, within 1.19× of
#:   the fastest path at every size (2¹⁸ took over 10×: each chunk is a few kernel launches);
#:   the float64 conditional was 1.13× and 1.15× faster at T = 256 and 512 (slower at T = 64)
#:   but takes 3× the memory, and would be many times slower on the GPUs whose float64 runs at
#:   1/32 or 1/64 of their float32 rate, so it is not the default;
#: - fused attention, 2× (GPU) to 5× (CPU) faster than the sites, on both.
MEASURED: dict[str, Paths] = {
    "cpu": Paths("factored", 1 << 18, "fused"),
    "cuda": Paths("factored", 1 << 24, "fused"),
}

_OVERRIDES: ContextVar[tuple[tuple[str, Any], ...]] = ContextVar("probtrans_paths", default=())


def device_type(device: Any) -> str:
    """``"cuda"`` of ``"cuda:1"``, a ``torch.device`` or a device type."""
    return str(getattr(device, "type", device)).split(":")[0]


def paths_for(device: Any) -> Paths:
    """The paths work on ``device`` takes: :data:`MEASURED`'s, with the overrides of the
    enclosing :func:`use_paths` blocks."""
    measured = MEASURED.get(device_type(device), MEASURED["cpu"])
    return replace(measured, **dict(_OVERRIDES.get()))


@contextmanager
def use_paths(**choices: Any) -> Iterator[None]:
    """Within the block, take the paths named (``sgpa_conditional="float64"``, ...) on every
    device; a choice of ``"auto"`` or None keeps the measured one (or an outer block's)."""
    unknown = sorted(set(choices) - set(Paths.__dataclass_fields__))
    if unknown:
        raise TypeError(f"use_paths: no path named {', '.join(unknown)}")
    chosen = {name: value for name, value in choices.items() if value not in (None, "auto")}
    token = _OVERRIDES.set(tuple((dict(_OVERRIDES.get()) | chosen).items()))
    try:
        yield
    finally:
        _OVERRIDES.reset(token)


def taken(device: Any, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """What a run folder records of the paths (``timing.json``): the device type and the paths
    work on ``device`` takes under ``overrides`` (a spec's ``[paths]``)."""
    with use_paths(**overrides):
        return {"device": device_type(device), **asdict(paths_for(device))}
