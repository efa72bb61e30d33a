"""The ELBO's terms per epoch and after training: from the training step's own traces, the loss
and gradients unchanged, ELBO = E_q[log p(y | ·)] − KL at full weight beside the annealed
objective; the training log (CSV, TensorBoard) of the same records."""

from __future__ import annotations

import csv
import dataclasses
import json
import sys

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceMeanField_ELBO
from torch.distributions import Categorical, kl_divergence

from probtrans.classifier import build_classifier
from probtrans.contract import is_kl_term, kl_term
from probtrans.data import DataBundle, DataSplit
from probtrans.errors import ConfigError
from probtrans.inference.guide_builder import build_guide
from probtrans.inference.objective import KLWeight, loss_and_terms, make_elbo, self_guided
from probtrans.inference.train import SVITraining, train_classifier
from probtrans.inference.training_log import TensorBoardLog, open_log
from probtrans.resolve import load_inference_spec
from probtrans.runs import fit
from probtrans.runs.folder import check_replaceable
from probtrans.specs import ElboSpec, GuideSpec
from tests.conftest import ROOT, inference_file, tiny_inference, tiny_spec

SGPA = {"kernel": "ard", "n_inducing": 4, "lengthscale": 4.0, "outputscale": 0.1}


def model_spec(kind: str):
    return tiny_spec(kind, prior="last_layer", **(SGPA if kind == "sgpa" else {}))


def batch(digits, size=16):
    index, inputs, mask, labels = next(digits.train.batches(size))
    return inputs, mask, labels, index


def small(data: DataBundle, n_train: int = 192, n_val: int = 64) -> DataBundle:
    """``data`` with its first ``n_train`` training and ``n_val`` validation rows."""
    train, val = data.train, data.val
    return dataclasses.replace(
        data,
        train=DataSplit(train.inputs[:n_train], train.labels[:n_train]),
        val=DataSplit(val.inputs[:n_val], val.labels[:n_val]),
    )


# ------------------------------------------------------------------------- one step
@pytest.mark.parametrize("name", ["trace", "meanfield"])
@pytest.mark.parametrize("particles", [1, 3])
def test_the_loss_and_its_gradients_are_those_of_pyros_elbo(digits, name, particles):
    """loss_and_terms computes the loss as ``differentiable_loss`` did before: with the same
    seed, the same value and the same gradients, bit for bit (β = 0.5, a_t = 0.25)."""
    classifier = build_classifier(model_spec("h_sto"), digits)
    guide = build_guide(classifier, GuideSpec(name="normal"), digits.train)
    inputs, mask, labels, index = batch(digits)
    kl = KLWeight(0.5)
    kl.annealing = 0.25
    model, weighted_guide = kl(self_guided(classifier)), kl(guide)
    elbo = make_elbo(ElboSpec(name=name, particles=particles))
    params = [*classifier.parameters(), *guide.parameters()]

    def run(compute):
        for p in params:
            p.grad = None
        pyro.set_rng_seed(11)
        loss = compute(elbo, model, weighted_guide, inputs, mask, labels, index=index, n_data=800)
        loss.backward()
        return loss.detach(), [p.grad.clone() for p in params if p.grad is not None]

    before = run(lambda elbo, *args, **kwargs: elbo.differentiable_loss(*args, **kwargs))
    after = run(lambda *args, **kwargs: loss_and_terms(*args, **kwargs)[0])
    assert torch.equal(after[0], before[0])
    assert len(after[1]) == len(before[1]) > 0
    for a, b in zip(after[1], before[1], strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize(
    "kind, name", [("h_sto", "trace"), ("h_sto", "meanfield"), ("sgpa", "trace")]
)
def test_the_terms_are_a_hand_computation_on_one_batch(digits, kind, name):
    """The same draws by hand (weights from the guide, then â and SGPA's outputs in the model):
    E log p(y | ·) = N/B Σ log Categorical(y | logits), KL_global = Σ log q(W) − log p(W),
    KL_amortised = N/B Σ of SGPA's per-sequence KL; at full weight whatever β and a_t, while the
    loss is −(E log p − a_t (β KL_global + KL_amortised)). "meanfield" has no analytic KL here,
    as in Pyro: AutoNormal's weight sites are Delta (its Normal sites are auxiliary); the toy
    model below checks the analytic one."""
    classifier = build_classifier(model_spec(kind), digits)
    guide = build_guide(classifier, GuideSpec(name="normal"), digits.train)
    inputs, mask, labels, index = batch(digits)
    n = len(digits.train)
    kl = KLWeight(2.0)
    kl.annealing = 0.3
    elbo = make_elbo(ElboSpec(name=name))
    pyro.set_rng_seed(5)
    loss, terms = loss_and_terms(
        elbo, kl(self_guided(classifier)), kl(guide), inputs, mask, labels, index=index, n_data=n
    )

    pyro.set_rng_seed(5)
    with torch.no_grad():
        guide_trace = poutine.trace(guide).get_trace(inputs, mask, labels)
        replayed = poutine.trace(poutine.replay(classifier, trace=guide_trace))
        model_trace = replayed.get_trace(inputs, mask, labels, index, n)
        logits = model_trace.nodes["_RETURN"]["value"]
        likelihood = n / len(inputs) * Categorical(logits=logits).log_prob(labels).sum()
        log_q = log_p = 0.0
        for site, q in guide_trace.nodes.items():  # AutoNormal: w_unconstrained ~ N, w ~ Delta(w)
            if q["type"] == "sample":
                log_q += q["fn"].log_prob(q["value"]).sum()
                if site in model_trace.nodes:
                    log_p += model_trace.nodes[site]["fn"].log_prob(q["value"]).sum()
        kl_global = log_q - log_p
        amortised = [
            s for s in model_trace.nodes.values() if s["type"] == "sample" and is_kl_term(s)
        ]
        kl_amortised = sum(n / len(inputs) * -s["fn"].log_factor.sum() for s in amortised)
    assert (len(amortised) > 0) == (kind == "sgpa")

    expected = [likelihood.item(), float(kl_global), float(kl_amortised)]
    assert terms.tolist() == pytest.approx(expected, rel=1e-5, abs=1e-4)
    objective = likelihood - 0.3 * (2.0 * kl_global + kl_amortised)
    assert -loss.item() == pytest.approx(objective.item(), rel=1e-5)


@pytest.mark.parametrize("cls", [Trace_ELBO, TraceMeanField_ELBO])
@pytest.mark.parametrize("vectorize", [False, True])
def test_particles_and_vectorised_particles_average_the_terms(cls, vectorize):
    """A model with a global w ~ N(0, 1), a per-example KL term x² and y ~ N(w x, 1) in a
    subsampled plate; guide w ~ N(0.3, 0.5): 4 particles (vectorised or not) → the terms are the
    particle means of the hand-computed ones and the loss is Pyro's."""
    n, index = 10, torch.tensor([0, 4, 7])
    x, y = torch.tensor([0.5, -1.0, 2.0]), torch.tensor([0.1, 0.2, 1.5])

    def model():
        w = pyro.sample("w", dist.Normal(0.0, 1.0))
        with pyro.plate("data", n, subsample=index):
            kl_term("k", x**2)
            pyro.sample("y", dist.Normal(w * x, 1.0), obs=y)

    q = dist.Normal(torch.tensor(0.3, requires_grad=True), 0.5)

    def guide():
        pyro.sample("w", q)

    kl = KLWeight(1.5)
    kl.annealing = 0.5
    elbo = cls(num_particles=4, vectorize_particles=vectorize, max_plate_nesting=1)
    pyro.set_rng_seed(2)
    loss, terms = loss_and_terms(elbo, kl(model), kl(guide))
    pyro.set_rng_seed(2)
    assert loss.item() == pytest.approx(elbo.differentiable_loss(kl(model), kl(guide)).item())

    pyro.set_rng_seed(2)
    if vectorize:
        w = q.sample((4,))
    else:
        w = torch.stack([q.sample() for _ in range(4)])
    scale = n / len(x)
    likelihood = scale * dist.Normal(w[:, None] * x, 1.0).log_prob(y).sum(-1).mean()
    if cls is TraceMeanField_ELBO:
        kl_global = kl_divergence(q, dist.Normal(0.0, 1.0))
    else:
        kl_global = (q.log_prob(w) - dist.Normal(0.0, 1.0).log_prob(w)).mean()
    expected = [likelihood.item(), kl_global.item(), scale * (x**2).sum().item()]
    assert terms.tolist() == pytest.approx(expected, rel=1e-5)
    objective = expected[0] - 0.5 * (1.5 * expected[1] + expected[2])
    assert -loss.item() == pytest.approx(objective, rel=1e-5)


# ------------------------------------------------------------------------- the history
@pytest.mark.parametrize("kind", ["h_sto", "sgpa"])
def test_each_epoch_logs_the_elbo_its_terms_and_the_weighted_objective(digits, kind):
    """MFVI (meanfield) without annealing, β = 0.5: elbo = ell − kl, kl = kl_global +
    kl_amortised, objective = ell − β kl_global − kl_amortised (β leaves the amortised KL
    alone); SGPA's amortised KL is part of kl. The kept state's training-set terms obey the
    same identity, and the learning rate is the schedule's."""
    data = small(digits)
    spec = load_inference_spec(ROOT / "inference" / "mfvi.toml")
    spec.train.epochs, spec.train.batch_size, spec.train.val_samples = 2, 64, 1
    spec.elbo.kl_anneal_epochs, spec.elbo.kl_weight = 0, 0.5
    classifier = build_classifier(model_spec(kind), data)
    result = train_classifier(classifier, data, spec, progress=False)
    assert [r["epoch"] for r in result.history] == [1, 2]
    for record in result.history:
        ell, kl = record["expected_log_likelihood"], record["kl"]
        assert record["elbo"] == pytest.approx(ell - kl, rel=1e-12)
        assert kl == pytest.approx(record["kl_global"] + record["kl_amortised"], rel=1e-12)
        weighted = ell - 0.5 * record["kl_global"] - record["kl_amortised"]
        assert record["objective"] == pytest.approx(weighted, rel=1e-6)
        assert (record["kl_amortised"] > 0) == (kind == "sgpa")
        assert record["kl_annealing"] == 1.0 and 0 < record["lr"] <= spec.optim.lr
        assert {"val_accuracy", "val_mcc", "val_nll"} <= set(record)
    final = result.elbo_terms
    assert set(final) == {"elbo", "expected_log_likelihood", "kl", "kl_global", "kl_amortised"}
    assert final["elbo"] == pytest.approx(final["expected_log_likelihood"] - final["kl"])
    assert final["kl_global"] > 0 and (final["kl_amortised"] > 0) == (kind == "sgpa")


def test_under_kl_annealing_the_objective_lies_between_the_elbo_and_the_likelihood(digits):
    """Annealing over 2 epochs (a_t < 1 throughout epoch 1) with the analytic KL ≥ 0: each step
    maximises ell − a_t KL ≥ ell − KL, so the epoch's objective is above its ELBO (and below its
    expected log-likelihood); the ELBO itself is not annealed."""
    data = small(digits)
    spec = load_inference_spec(ROOT / "inference" / "mfvi.toml")
    spec.train.epochs, spec.train.batch_size, spec.train.val_samples = 1, 64, 1
    spec.elbo.kl_anneal_epochs = 2
    classifier = build_classifier(model_spec("h_sto"), data)
    (record,) = train_classifier(classifier, data, spec, progress=False).history
    assert record["kl_annealing"] < 1 and record["kl"] > 0
    assert record["elbo"] < record["objective"] < record["expected_log_likelihood"]
    assert record["elbo"] == pytest.approx(record["expected_log_likelihood"] - record["kl"])


def test_the_training_set_elbo_is_seeded_and_leaves_the_random_state(digits):
    data = small(digits)
    spec = load_inference_spec(ROOT / "inference" / "mfvi.toml")
    classifier = build_classifier(model_spec("h_sto"), data)
    svi = SVITraining(classifier, data, spec, seed=0, device="cpu")
    state = pyro.util.get_rng_state()
    first = svi.training_set_elbo(seed=3)
    assert svi.training_set_elbo(seed=3) == first != svi.training_set_elbo(seed=4)
    assert torch.equal(torch.get_rng_state(), state["torch"])


# ------------------------------------------------------------------------- the logs
def test_a_fit_writes_one_csv_row_per_epoch_with_the_history_and_the_final_elbo(
    tmp_path, tiny_model_file
):
    out = tmp_path / "run"
    scores = fit(tiny_model_file, tiny_inference(tmp_path, "mfvi"), out=out, progress=False).metrics
    history = json.loads((out / "history.json").read_text())
    with (out / "history.csv").open(newline="") as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == len(history) == 2
    for row, record in zip(rows, history, strict=True):
        assert list(row) == list(record)
        assert {key: json.loads(value) for key, value in row.items()} == record
        assert row["elbo"] == repr(record["elbo"])  # the same digits as history.json
    for key in ("elbo", "expected_log_likelihood", "kl"):
        assert json.loads((out / "metrics.json").read_text())[key] == scores[key]
    assert scores["elbo"] == pytest.approx(scores["expected_log_likelihood"] - scores["kl"])
    timing = json.loads((out / "timing.json").read_text())  # wall time: out of history.json
    assert len(timing["epoch_seconds"]) == 2 and min(timing["epoch_seconds"]) > 0
    assert sum(timing["epoch_seconds"]) == pytest.approx(timing["train_seconds"])
    assert not (out / "tensorboard").exists()
    check_replaceable(out)  # a run folder: replaced without --force


def test_without_tensorboard_the_logger_names_the_field_and_the_package(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # import fails
    with pytest.raises(ConfigError, match=r'\[train\] logger = "tensorboard".*pip install'):
        open_log("tensorboard", tmp_path, first_epoch=1)
    assert open_log("tensorboard", None, first_epoch=1).epoch([{"epoch": 1}], 0.0) is None
    assert list(tmp_path.iterdir()) == []


def scalars(folder) -> dict[str, list[tuple[int, float]]]:
    """The scalars of a TensorBoard folder: tag → (step, value) in order."""
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    events = accumulator.EventAccumulator(str(folder))
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def test_a_fit_with_the_tensorboard_logger_writes_the_history_as_scalars(tmp_path, tiny_model_file):
    pytest.importorskip("tensorboard")
    text = tiny_inference(tmp_path, "map").read_text()
    text = text.replace("[train]", '[train]\nlogger = "tensorboard"')
    inference = inference_file(tmp_path, "map_tb.toml", text)
    out = tmp_path / "run"
    fit(tiny_model_file, inference, out=out, progress=False)
    history = json.loads((out / "history.json").read_text())
    logged = scalars(out / "tensorboard")
    assert set(logged) == (set(history[0]) - {"epoch"}) | {"seconds"}
    for key, values in logged.items():
        assert [step for step, _ in values] == [1, 2]
        if key != "seconds":  # float32 in the event file
            assert [v for _, v in values] == pytest.approx([r[key] for r in history], rel=1e-6)
    assert all(v > 0 for _, v in logged["seconds"])
    assert not (out / "history.csv").exists()
    check_replaceable(out)


def test_a_resumed_tensorboard_log_replaces_the_epochs_trained_again(tmp_path):
    """The first session logged epochs 1–3 but saved its state after epoch 2: the resumed one
    (first epoch 3) hides the old epoch 3 and logs its own."""
    pytest.importorskip("tensorboard")
    history = [{"epoch": e, "elbo": -float(e)} for e in (1, 2, 3)]
    with open_log("tensorboard", tmp_path, first_epoch=1) as log:
        for e in (1, 2, 3):
            log.epoch(history[:e], seconds=1.0)
    history[2] = {"epoch": 3, "elbo": -30.0}
    with open_log("tensorboard", tmp_path, first_epoch=3) as log:
        assert isinstance(log, TensorBoardLog)
        log.epoch(history, seconds=1.0)
    assert scalars(tmp_path / "tensorboard")["elbo"] == [(1, -1.0), (2, -2.0), (3, -30.0)]
