"""ArviZ ``InferenceData`` of your own Pyro classifier and its guide, in the conventions of a run
folder's ``predictive.nc`` (:func:`probtrans.inference.predictive.inference_data` builds both).

S posterior draws W_s of the guide's global sites are taken once. For each draw the model,
conditioned on W_s, runs on the training and the test inputs; its own local random sites
(attention weights â) are drawn from their distribution in every pass, seeded with ``seed``
before each draw's passes, so that every draw sees the same local random numbers (common random
numbers: the rows of the log-likelihood differ by W_s alone, as in
:func:`probtrans.inference.predictive.draw_predictive`). With R ``replicas`` per draw, the
class probabilities are averaged over R draws of â: p̄_s(c | x_n) = (1/R) Σ_r p(c | x_n, W_s, â_r),
and the pointwise log-likelihood is log p̄_s(y_n | x_n) (PSIS-LOO, Vehtari, Gelman & Gabry 2017,
reads the training rows; the test rows are the held-out values).

The observed site must be a ``Categorical`` (a classifier). A regression likelihood (e.g. a
Normal) is refused: the file's posterior predictive holds labels drawn from class probabilities.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyro
import torch
from pyro import poutine
from pyro.infer import Predictive
from torch import Tensor
from torch.distributions import Categorical

from probtrans.errors import ProbtransError
from probtrans.inference.predictive import az, inference_data
from probtrans.runtime.caller_state import caller_random_state


@caller_random_state()
@torch.no_grad()
def to_inference_data(
    model: Callable,
    guide: Callable,
    x_train: Tensor,
    y_train: Tensor,
    x_test: Tensor,
    y_test: Tensor,
    *,
    samples: int = 100,
    replicas: int = 1,
    seed: int = 0,
    observed_site: str = "y",
    class_names: Sequence[str] | None = None,
    batch_size: int | None = None,
) -> az.InferenceData:
    """The ``InferenceData`` of ``model`` (called as ``model(x, y)``, ``y`` observed at
    ``observed_site`` by a ``Categorical`` over C classes) under ``guide`` (called as
    ``guide(x_train, y_train)``; e.g. an autoguide of ``probtrans.self_guided(model)``), one
    chain of ``samples`` draws S, in the layout of a run's ``predictive.nc``:

    - ``posterior``: the S draws of every global site the guide draws (the model's latent sites
      whose shape does not follow the number of examples, e.g. ``readout.weight``);
    - ``log_likelihood``: ``y_train`` (S, N_train), log p̄_s(y_n | x_n), what ``az.loo`` reads;
    - ``posterior_predictive``: ``y_train`` and ``y_test`` drawn from each draw's class
      probabilities, and ``log_lik_test`` (S, N_test), the held-out log p̄_s(ỹ_n | x̃_n);
    - ``observed_data``: ``y_train`` and ``y_test``.

    ``x_*`` are the model's inputs (N, ...), ``y_*`` integer labels (N,) on the model's device.
    The guide's draws, the local randomness (averaged over ``replicas`` passes per draw: module
    docstring) and the drawn labels are seeded by ``seed``; the model runs on ``batch_size``
    rows at a time (all at once by default) in the mode it is in (``model.eval()`` turns dropout
    off). The caller's random state is left as it was. Cost: S × R passes over the training and
    test inputs, and the model traced on one and two training examples (global sites are those
    whose shape does not change; a guide that draws a local site is refused).
    """
    for name, value in (("samples", samples), ("replicas", replicas), ("batch_size", batch_size)):
        if value is not None and value < 1:
            raise ProbtransError(f"{name} must be ≥ 1, got {value}")
    check_sizes(x_train, y_train, "train")
    check_sizes(x_test, y_test, "test")
    # the model on one and on two examples: its sites, global or local (shape per example)
    one, two = (poutine.trace(model).get_trace(x_train[:n], y_train[:n]).nodes for n in (1, 2))
    n_classes = class_log_probs(one, observed_site, 1).shape[-1]
    check_labels(y_train, "train", n_classes)
    check_labels(y_test, "test", n_classes)
    if class_names is not None and len(class_names) != n_classes:
        raise ProbtransError(
            f"class_names must name the model's {n_classes} classes, got {len(class_names)}"
        )
    pyro.set_rng_seed(seed)
    drawn = Predictive(guide, num_samples=samples)(x_train, y_train)  # site → (S, ...)
    posterior = {name: drawn[name] for name in global_sites(one, two, drawn)}
    rows = batch_size or max(len(x_train), len(x_test))
    train, test = [], []  # per draw: (log-likelihood (N,), class probabilities (N, C))
    for s in range(samples):
        conditioned = poutine.condition(model, data={k: v[s] for k, v in posterior.items()})
        pyro.set_rng_seed(seed)  # the same local random numbers for every draw
        train.append(averaged(conditioned, x_train, y_train, observed_site, replicas, rows))
        test.append(averaged(conditioned, x_test, y_test, observed_site, replicas, rows))
    return inference_data(
        {},
        y_test.cpu().numpy(),
        list(class_names) if class_names is not None else [str(c) for c in range(n_classes)],
        posterior={name: value.cpu().numpy() for name, value in posterior.items()},
        train_log_lik=np.stack([pair[0] for pair in train]),
        train_labels=y_train.cpu().numpy(),
        train_probs=np.stack([pair[1] for pair in train]),
        test_log_lik=np.stack([pair[0] for pair in test]),
        test_probs=np.stack([pair[1] for pair in test]),
        seed=seed,
    )


def check_sizes(x: Tensor, y: Tensor, split: str) -> None:
    """Inputs (N, ...) and labels (N,) of one split, N ≥ 2."""
    if y.dim() != 1 or len(x) != len(y) or len(y) < 2:
        raise ProbtransError(
            f"x_{split} (N, ...) and y_{split} (N,) must hold the same number N ≥ 2 of "
            f"examples, got shapes {tuple(x.shape)} and {tuple(y.shape)}"
        )


def check_labels(y: Tensor, split: str, n_classes: int) -> None:
    """Integer labels (N,) in [0, C)."""
    if y.dtype.is_floating_point or y.dtype.is_complex or y.dtype == torch.bool:
        raise ProbtransError(f"y_{split} must be integer labels, got {y.dtype}")
    if int(y.min()) < 0 or int(y.max()) >= n_classes:
        raise ProbtransError(
            f"y_{split} must lie in [0, {n_classes}), the model's classes, "
            f"got values in [{int(y.min())}, {int(y.max())}]"
        )


def global_sites(one: dict, two: dict, drawn: dict[str, Tensor]) -> list[str]:
    """The sites of ``drawn`` (the guide's draws, site → (S, ...)) that are global in the model,
    whose trace on one example is ``one`` and on two ``two``: latent sites whose shape does not
    follow the examples. A drawn local site is refused (the model is conditioned on global sites
    only), and so is a guide that draws no global site."""
    found = []
    for name, value in drawn.items():
        node = one.get(name)
        if node is None or node["type"] != "sample" or node["is_observed"]:
            continue  # e.g. an autoguide's auxiliary site
        shape = node["value"].shape
        if two[name]["value"].shape != shape or value.shape[1:] != shape:
            raise ProbtransError(
                f"the guide draws {name!r}, a local site of the model (shape {tuple(shape)} on "
                "one example): to_inference_data conditions the model on global sites only"
            )
        found.append(name)
    if not found:
        raise ProbtransError(
            f"the guide draws none of the model's global sites (it draws {sorted(drawn)})"
        )
    return found


def averaged(
    model: Callable, x: Tensor, y: Tensor, observed_site: str, replicas: int, rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """log p̄(y_n | x_n) (N,) and p̄(c | x_n) (N, C), float64, the local randomness averaged
    over ``replicas`` passes of ``model`` on ``rows`` examples at a time."""
    passes = []  # R × (N, C)
    for _ in range(replicas):
        parts = []
        for i in range(0, len(x), rows):
            nodes = poutine.trace(model).get_trace(x[i : i + rows], y[i : i + rows]).nodes
            parts.append(class_log_probs(nodes, observed_site, len(y[i : i + rows])))
        passes.append(torch.cat(parts))
    log_p = torch.stack(passes)  # (R, N, C)
    mean = log_p.logsumexp(0) - np.log(replicas)  # (N, C)
    return mean.gather(-1, y.long()[:, None])[:, 0].cpu().numpy(), mean.exp().cpu().numpy()


def class_log_probs(nodes: dict, observed_site: str, n: int) -> Tensor:
    """log p(c | x_n) (n, C), float64, of the ``Categorical`` that observes the labels at
    ``observed_site`` in a model trace's ``nodes`` on n examples (masks and event wrappers
    unwrapped)."""
    node = nodes.get(observed_site)
    if node is None or node["type"] != "sample" or not node["is_observed"]:
        sites = sorted(name for name, node in nodes.items() if node["type"] == "sample")
        raise ProbtransError(
            f"observed_site {observed_site!r} is not an observed site of the model (its sites: "
            f"{', '.join(sites)})"
        )
    fn = node["fn"]
    while hasattr(fn, "base_dist") and not isinstance(fn, Categorical):
        fn = fn.base_dist
    if not isinstance(fn, Categorical):
        raise ProbtransError(
            f"to_inference_data reads a Categorical likelihood at {observed_site!r} "
            f"(a classifier); the model's is {type(node['fn']).__name__}, which is not supported"
        )
    if fn.logits.shape[:-1] != (n,):
        raise ProbtransError(
            f"the Categorical at {observed_site!r} must have one row per example, ({n}, C); "
            f"got {tuple(fn.logits.shape)}"
        )
    return fn.logits.double()  # normalised logits: log-probabilities
