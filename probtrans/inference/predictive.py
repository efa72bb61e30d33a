"""Posterior predictive with ``pyro.infer.Predictive`` and its ArviZ ``InferenceData``.

Posterior draws of the global sites are taken once and shared by every example; samples that
share their global draw are evaluated in one batched pass (see :func:`sample_predictive`). Only
requested sites are kept: class probabilities ``probs`` and sampled labels ``obs`` always, the
attention matrices only with ``attention=True`` (they are B × H × L × L per sample).
:func:`log_likelihood` is the pointwise likelihood of each global draw, the local randomness
averaged out, that PSIS-LOO reads (:mod:`probtrans.analysis.elpd`).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer import Predictive
from torch import Tensor, nn

from probtrans.analysis.elpd import arviz
from probtrans.attention import attention_sites, inducing_sites
from probtrans.classifier import Classifier, head_outputs
from probtrans.data import DataSplit
from probtrans.inference.objective import self_guided
from probtrans.runtime.caller_state import local_params
from probtrans.runtime.progress import progress_bar

az = arviz()


#: the global sites of the linear head (a last-layer prior)
HEAD_SITES = frozenset({"head.weight", "head.bias"})


@local_params()
@torch.no_grad()
def posterior_draws(
    guide: Callable,
    samples: int,
    split: DataSplit,
    device: str | torch.device = "cpu",
    head_draws: int = 1,
) -> dict[str, Tensor]:
    """S draws of every global site of ``guide`` (weights, inducing variables): name → (S, ...),
    on the device of the guide's parameters (the guide is called on a row of ``split`` on
    ``device``).

    ``head_draws`` = M > 1: draws s = kM, ..., kM + M − 1 share the sites below the head
    (:data:`HEAD_SITES`), those of draw kM, and each has its own head, so that the S draws ask
    for ⌈S/M⌉ passes of the network (:func:`sample_predictive` evaluates each head on its
    group's features). Each draw is still one of q's only where q draws the head independently
    of the rest (a mean-field head: :func:`probtrans.inference.head_variances.head_guide`
    checks it)."""
    _, inputs, mask, _ = next(split.batches(1))
    mask = None if mask is None else mask.to(device)
    draws = Predictive(guide, num_samples=samples)(inputs.to(device), mask)
    shared = torch.arange(samples) // head_draws * head_draws  # draw s's network: draw shared[s]
    return {
        name: value.detach() if name in HEAD_SITES else value.detach()[shared.to(value.device)]
        for name, value in draws.items()
    }


def network_groups(draws: dict[str, Tensor]) -> list[tuple[int, int]]:
    """The runs [start, stop) of consecutive draws that differ in the head's sites alone (each
    draw its own run where the head is not drawn): one network, evaluated once for them."""
    count = len(next(iter(draws.values()))) if draws else 1
    if not HEAD_SITES <= set(draws):
        return [(s, s + 1) for s in range(count)]
    below = [value.reshape(count, -1) for name, value in draws.items() if name not in HEAD_SITES]
    starts = [0] + [
        s for s in range(1, count) if any(not torch.equal(v[s], v[s - 1]) for v in below)
    ]
    return list(zip(starts, [*starts[1:], count], strict=True))


def global_sites(classifier: Classifier) -> list[str]:
    """The global sites of ``classifier``: its weights with priors and its inducing variables u_g
    (a guide's draws may hold more: an autoguide's ``*_unconstrained`` sites)."""
    return [*classifier.prior_sites, *inducing_sites(classifier)]


def is_point_mass(draws: dict[str, Tensor]) -> bool:
    """Whether all S draws are the same (a ``delta`` guide, or no global sites)."""
    return all(bool((value == value[:1]).all()) for value in draws.values())


def dropout_on(classifier: Classifier) -> None:
    """Put every dropout in training mode: ``nn.Dropout`` modules and attention weight dropout
    (the only thing attention modules do differently in training)."""
    for module in classifier.modules():
        rate = getattr(module, "dropout", None)
        if isinstance(module, nn.Dropout) or (isinstance(rate, float) and rate > 0.0):
            module.train()


@local_params()
@torch.no_grad()
def sample_predictive(
    classifier: Classifier,
    guide: Callable | None,
    split: DataSplit,
    samples: int = 10,
    batch_size: int = 256,
    device: str = "cpu",
    attention: bool = False,
    draws: dict[str, Tensor] | None = None,
    mc_dropout: bool = False,
    extra_sites: Sequence[str] = (),
    progress: bool = False,
) -> dict[str, np.ndarray]:
    """S posterior predictive draws on ``split``, streamed over the data.

    The S global draws (``draws``, default :func:`posterior_draws` of ``guide``; on any device:
    the model runs on ``device``) are the same for every example. When they are all equal
    (point-mass guides) the S samples differ only in their local randomness (attention, dropout)
    and one pass evaluates all of them on the batch repeated S times (once, if the model has no
    local randomness); otherwise each network gets its own pass: a run of draws that differ in
    the head alone (:func:`network_groups`, e.g. ``posterior_draws``' ``head_draws``) is one
    network, run once (with local randomness, on the batch repeated once per draw, each draw its
    own replica) and each draw's head applied to its features. A pass holds about ``batch_size``
    rows, whatever the size of ``split``. Each pass is what ``Predictive`` does for one draw
    (condition the model on it and trace), without the two shape-probing model passes
    ``Predictive`` adds to every call.

    The R replicas of one draw in a pass share what the classifier computes before its first
    randomness (:meth:`~probtrans.classifier.PyroClassifier.replicas_shared`: a pretrained
    backbone's lower blocks run once for them).

    ``mc_dropout=True`` keeps dropout on (MC dropout, Gal & Ghahramani 2016) and nothing else of
    training mode. ``progress=True`` shows a bar over the batches.

    Returns ``probs`` (S, N, C), ``obs`` (S, N), ``energy`` (S, N), the ``extra_sites`` (e.g.
    ``features``) and, with ``attention=True``, every attention site (S, N, H, L, ·).
    """
    local_sites = attention_sites(classifier)
    sites = ["probs", "obs", "energy", *extra_sites, *(local_sites if attention else [])]
    if len(split) == 0:  # e.g. a data set without out-of-domain examples
        n_classes = classifier.head.out_features
        return {
            name: np.zeros((samples, 0, n_classes) if name == "probs" else (samples, 0))
            for name in sites
        }
    model = classifier if attention else self_guided(classifier)
    draws = posterior_draws(guide, samples, split, device) if draws is None else draws
    # without local randomness a point-mass posterior has one predictive: compute it once
    local = mc_dropout or bool(local_sites)
    # one pass over a batch per network: (its first draw, its draws, replicas, heads applied)
    if is_point_mass(draws):
        passes = [(0, samples, samples if local else 1, False)]
    else:
        passes = [
            (start, stop - start, stop - start if local else 1, stop - start > 1)
            for start, stop in network_groups(draws)
        ]
    conditioned = [
        poutine.condition(model, data={name: value[s].to(device) for name, value in draws.items()})
        for s, *_ in passes
    ]
    was_training = classifier.training
    classifier.eval()
    if mc_dropout:
        dropout_on(classifier)
    chunks: dict[str, list[np.ndarray]] = {name: [] for name in sites}
    located: list[Tensor] = []  # the split's row numbers of each batch
    rows_per_pass = max(1, batch_size // max(replicas for _, _, replicas, _ in passes))
    # rows in order of length, so that token batches carry little padding; order restored below
    batches = progress_bar(
        split.batches(rows_per_pass, trim=not attention, by_length=True),
        total=math.ceil(len(split) / rows_per_pass),
        desc="predictive",
        unit="batch",
        leave=False,
        disable=not progress,
    )
    for index, inputs, mask, _ in batches:  # (B, L) sites
        located.append(index)
        n = len(inputs)
        outputs: dict[str, list[Tensor]] = {name: [] for name in sites}
        for (first, count, replicas, heads), run in zip(passes, conditioned, strict=True):
            rows = inputs.repeat(replicas, *[1] * (inputs.dim() - 1)).to(device)  # sample-major
            rows_mask = None if mask is None else mask.repeat(replicas, 1).to(device)
            with classifier.replicas_shared(replicas):
                trace = poutine.trace(run).get_trace(rows, rows_mask)
            values = {
                name: node["value"].reshape(replicas, n, *node["value"].shape[1:])
                for name, node in trace.nodes.items()
                if name in sites or name == "features"
            }
            if heads:  # each draw's head on its replica of the network's features
                values = {name: v.expand(count, *v.shape[1:]) for name, v in values.items()}
                features = values["features"]  # (G, B, D)
                weight = draws["head.weight"][first : first + count].to(device)  # (G, C, D)
                bias = draws["head.bias"][first : first + count].to(device)  # (G, C)
                logits = features.float() @ weight.float().mT + bias.float()[:, None]
                probs, energy = head_outputs(logits)
                obs = dist.Categorical(logits=logits).sample()
                values |= {"probs": probs, "energy": energy, "obs": obs}
            for name in sites:
                outputs[name].append(values[name])
        for name in sites:
            value = torch.cat(outputs[name]).expand(samples, *outputs[name][0].shape[1:])
            chunks[name].append(value.cpu().numpy())  # (S, B, ...)
    classifier.train(was_training)
    order = torch.cat(located).argsort().numpy()
    return {name: np.concatenate(parts, axis=1)[:, order] for name, parts in chunks.items()}


@local_params()
@torch.no_grad()
def log_likelihood(
    classifier: Classifier,
    draws: dict[str, Tensor],
    split: DataSplit,
    replicas: int,
    batch_size: int = 256,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = False,
) -> np.ndarray:
    """The pointwise log-likelihood of each global draw W_s on the labelled ``split``, the
    local randomness averaged out: log (1/R) Σ_r p(y_n | x_n, W_s, â_r) → (S, N) float64
    (:func:`draw_predictive`)."""
    return draw_predictive(classifier, draws, split, replicas, batch_size, device, seed, progress)[
        0
    ]


def draw_predictive(
    classifier: Classifier,
    draws: dict[str, Tensor],
    split: DataSplit,
    replicas: int,
    batch_size: int = 256,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """For each global draw W_s (``draws``: global site → (S, ...)) on the labelled ``split``,
    the local randomness â (attention samples, SGPA outputs) averaged out over R = ``replicas``
    draws: the class probabilities p̄_s(c | x_n) = (1/R) Σ_r p(c | x_n, W_s, â_r) → (S, N, C),
    and the pointwise log-likelihood log p̄_s(y_n | x_n) → (S, N), both float64.

    Conditioned on one draw of â, the likelihood of W_s would carry the noise of â, so that even
    a point-mass posterior would look uncertain to PSIS-LOO. The R replicas are the same random
    numbers for every draw (the local randomness is seeded with ``seed`` before each draw's
    pass: common random numbers), so rows differ by W_s alone. Cost, in passes over ``split``:
    R for a point mass, which is evaluated once (→ one row); G × R for draws that make G
    networks below a drawn head (:func:`network_groups`: each network runs R times, each
    draw's head is applied to its features; G = 1 for a last-layer prior, G = S when every draw
    differs inside the network, e.g. SGPA's u_g drawn from a Normal). A label probability below
    float32's smallest normal number (≈ 1e-38) counts as that number.
    """
    labels = split.labels.long()  # (N,)
    n_draws = len(next(iter(draws.values()))) if draws else 1
    rows = 1 if is_point_mass(draws) else n_draws
    if len(split) == 0:
        return np.zeros((rows, 0)), np.zeros((rows, 0, classifier.head.out_features))

    def replicated(draw: dict[str, Tensor], sites: Sequence[str] = ()) -> dict[str, np.ndarray]:
        pyro.set_rng_seed(seed)
        return sample_predictive(
            classifier,
            None,
            split,
            replicas,
            batch_size,
            device,
            draws=draw,
            extra_sites=sites,
            progress=progress,
        )

    def averaged(log_p: Tensor) -> tuple[np.ndarray, np.ndarray]:  # (R, N, C) → (N,), (N, C)
        log_p = log_p.double()
        taken = log_p.gather(-1, labels.expand(len(log_p), -1)[..., None])[..., 0]
        mean_log = math.log(len(log_p))
        return (taken.logsumexp(0) - mean_log).numpy(), (
            log_p.logsumexp(0) - mean_log
        ).exp().numpy()

    if is_point_mass(draws) or not HEAD_SITES <= set(draws):
        tiny = float(np.finfo(np.float32).tiny)
        per_draw = [
            replicated({name: value[s : s + 1] for name, value in draws.items()})["probs"]
            for s in range(rows)
        ]  # each (R, N, C)
        pairs = [averaged(torch.as_tensor(p).clamp_min(tiny).log()) for p in per_draw]
    else:  # the network once per group of draws that differ in the head alone
        weight, bias = draws["head.weight"].cpu(), draws["head.bias"].cpu()  # (S, C, D), (S, C)
        pairs = []
        for start, stop in network_groups(draws):
            first = {name: value[start : start + 1] for name, value in draws.items()}
            features = torch.as_tensor(replicated(first, ("features",))["features"])  # (R, N, D)
            pairs += [
                averaged((features @ weight[s].T + bias[s]).log_softmax(-1))
                for s in range(start, stop)
            ]
    return np.stack([pair[0] for pair in pairs]), np.stack([pair[1] for pair in pairs])


def inference_data(
    test: dict[str, np.ndarray],
    labels: np.ndarray,
    class_names: Sequence[str],
    ood: dict[str, dict[str, np.ndarray]] | None = None,
    *,
    posterior: dict[str, np.ndarray] | None = None,
    train_log_lik: np.ndarray | None = None,
    train_labels: np.ndarray | None = None,
    train_probs: np.ndarray | None = None,
    test_log_lik: np.ndarray | None = None,
    test_probs: np.ndarray | None = None,
    seed: int = 0,
) -> az.InferenceData:
    """ArviZ InferenceData of a posterior predictive, one chain, in ArviZ's conventions: the
    training and test observations are the variables ``y_train`` and ``y_test`` of every group
    that has them, and ``posterior``, ``log_likelihood`` and ``posterior_predictive`` hold the
    same draws, so that ``az.loo``, ``az.loo_pit(idata, y="y_train")``, ``az.plot_ppc``,
    ``az.summary`` and ``az.compare`` read it as it is.

    With the training likelihoods (``train_log_lik`` (S, N_train) and ``train_probs``
    (S, N_train, C) of the S ``posterior`` draws, :func:`draw_predictive`; ``test_log_lik``
    and ``test_probs`` of the same draws):

    - ``posterior``: the S draws of every global site, named by site (``head.weight``);
    - ``log_likelihood``: ``y_train`` (dimension ``train_example``): what ``az.loo`` reads;
    - ``posterior_predictive``: ``y_train`` and ``y_test`` (dimension ``example``) drawn from
      each posterior draw's class probabilities (seeded by ``seed``; the smallest integer type
      that holds the classes), and ``log_lik_test``, the held-out pointwise values
      log p̄_s(ỹ_n) in float32 (not a likelihood of the fitted data, so not in
      ``log_likelihood``). The draws' class probabilities are not kept: S × N × C values would
      make the file of a large test split hundreds of megabytes;
    - ``observed_data``: ``y_train`` and ``y_test``.

    Without them, the S samples of the predictive on the test split (``test``: ``obs``,
    ``probs`` and the other sites drawn, e.g. ``energy``) are ``y_test``, ``probs_test`` and the
    others, beside ``log_lik_test`` where given, and ``observed_data`` holds ``y_test``.
    Each out-of-domain set NAME of ``ood`` is in ``predictions`` (``y_NAME``, ``probs_NAME``
    over ``example_NAME``). One chain: ``az.loo`` takes reff = 1 (SVI draws are independent);
    ``az.summary`` wants ``kind="stats"`` (R̂ needs several chains)."""
    coords = {"example": np.arange(len(labels)), "class": list(class_names)}
    dims = {
        "y_test": ["example"],
        "probs_test": ["example", "class"],
        "log_lik_test": ["example"],
        "y_train": ["train_example"],
    }
    observed = {"y_test": labels}
    if train_log_lik is not None:
        assert train_labels is not None and train_probs is not None and test_probs is not None
        generator = np.random.default_rng(seed)
        predictive = {
            "y_train": drawn_labels(train_probs, generator),
            "y_test": drawn_labels(test_probs, generator),
        }
        observed["y_train"] = train_labels
        coords["train_example"] = np.arange(len(train_labels))
    else:
        predictive = {"y_test": test["obs"], "probs_test": test["probs"]}
        for name, value in test.items():
            if name not in ("probs", "obs"):
                predictive[name] = value
                dims[name] = ["example", *[f"{name}_dim_{i}" for i in range(value.ndim - 2)]]
    if test_log_lik is not None:
        predictive["log_lik_test"] = test_log_lik.astype(np.float32)  # held-out values, not LOO
    kwargs: dict[str, Any] = {}
    if posterior:
        kwargs["posterior"] = {name: value[None] for name, value in posterior.items()}
    if train_log_lik is not None:
        kwargs["log_likelihood"] = {"y_train": train_log_lik[None]}
    if ood:
        predictions, pred_dims, pred_coords = {}, {}, {"class": list(class_names)}
        for name, sites in ood.items():
            example = f"example_{name}"
            predictions[f"y_{name}"] = sites["obs"][None]
            predictions[f"probs_{name}"] = sites["probs"][None]
            pred_dims[f"y_{name}"] = [example]
            pred_dims[f"probs_{name}"] = [example, "class"]
            pred_coords[example] = np.arange(sites["obs"].shape[1])
        kwargs |= {"predictions": predictions, "pred_dims": pred_dims, "pred_coords": pred_coords}
    idata = az.from_dict(
        posterior_predictive={name: value[None] for name, value in predictive.items()},
        observed_data=observed,
        coords=coords,
        dims=dims,
        **kwargs,
    )
    for group in idata.groups():  # no time stamp: the same draws give the same file
        idata[group].attrs.pop("created_at", None)
    return idata


def drawn_labels(probs: np.ndarray, generator: np.random.Generator) -> np.ndarray:
    """One class drawn from each row of ``probs`` (..., C) → (...), in the smallest signed
    integer type that holds C classes (ArviZ's plots want signed integers)."""
    cumulative = probs.cumsum(-1)
    uniform = generator.random(probs.shape[:-1])[..., None] * cumulative[..., -1:]
    drawn = np.minimum((cumulative < uniform).sum(-1), probs.shape[-1] - 1)
    return drawn.astype(np.result_type(np.int8, np.min_scalar_type(1 - probs.shape[-1])))


def netcdf_bytes(idata: az.InferenceData) -> bytes:
    """The NetCDF file (HDF5, zlib-compressed variables) of ``idata``, built in memory: the one
    ``idata.to_netcdf`` writes, group after group. Written to disk by the caller, a disk that
    fills up is an ordinary write error, never an HDF5 failure inside the file."""
    buffer = io.BytesIO()
    mode = "w"
    for group in idata.groups():
        data = idata[group]
        encoding = {
            name: {"zlib": True}
            for name, values in data.variables.items()
            if np.issubdtype(values.dtype, np.number) or values.dtype == bool
        }
        data.to_netcdf(buffer, mode=mode, group=group, engine="h5netcdf", encoding=encoding)
        mode = "a"
    return buffer.getvalue()
