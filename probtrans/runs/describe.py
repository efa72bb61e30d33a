"""``probtrans describe``: every Pyro sample site of a model — what is random in it."""

from __future__ import annotations

import pyro
import torch
from pyro import poutine
from pyro.distributions import Independent

from probtrans.classifier import build_classifier
from probtrans.contract import is_kl_term
from probtrans.errors import in_file
from probtrans.resolve import read_as_backbone
from probtrans.runtime.caller_state import local_params
from probtrans.specs import ModelSpec


@local_params()
def site_table(spec: ModelSpec, batch_size: int = 2) -> list[dict[str, str]]:
    """Trace the model of ``spec`` on ``batch_size`` training examples and list its sample sites:
    name, distribution class (unwrapping ``Independent``), batch shape, event shape, role."""
    with in_file(spec.file):  # a data loader's or the embedding's ``data.patch_size = 3: ...``
        data, backbone = read_as_backbone(spec)
        classifier = build_classifier(spec, data, backbone)
    _, inputs, mask, labels = next(data.train.batches(batch_size))
    pyro.set_rng_seed(0)
    with torch.no_grad():
        trace = poutine.trace(classifier).get_trace(inputs, mask, labels)
    rows = []
    for name, site in trace.nodes.items():
        if site["type"] != "sample" or site["infer"].get("_deterministic"):
            continue
        fn = site["fn"]
        base = fn
        while isinstance(base, Independent):  # .to_event(n) wrappers
            base = base.base_dist
        if type(base).__name__ == "_Subsample":
            continue
        if is_kl_term(site):
            role = "KL term (factor)"
        elif site["is_observed"]:
            role = "observed"
        else:
            role = "local (per example)" if site["cond_indep_stack"] else "global"
        rows.append(
            {
                "site": name,
                "distribution": type(base).__name__,
                "batch_shape": str(tuple(fn.batch_shape)),
                "event_shape": str(tuple(fn.event_shape)),
                "role": role,
            }
        )
    return rows


def format_sites(rows: list[dict[str, str]]) -> str:
    columns = ("site", "distribution", "batch_shape", "event_shape", "role")
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    lines = ["  ".join(c.ljust(widths[c]) for c in columns)]
    lines.append("  ".join("-" * widths[c] for c in columns))
    lines += ["  ".join(r[c].ljust(widths[c]) for c in columns) for r in rows]
    return "\n".join(line.rstrip() for line in lines)
