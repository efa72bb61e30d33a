"""Your own Pyro model with probtrans attention: train by SVI, sample with Predictive, analyse
with ArviZ. The README's "Python API" section; run by the tests (a few seconds on a CPU)."""

import arviz as az
import pyro
import pyro.distributions as dist
import torch
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample

import probtrans
from probtrans.nn import HierarchicalStochasticAttention, StochasticAttention


class SequenceClassifier(PyroModule):
    """Sequences (B, L, 16) → 2 classes: two stochastic attention layers, a Bayesian read-out."""

    def __init__(self, d_model: int = 16) -> None:
        super().__init__()
        self.attn1 = HierarchicalStochasticAttention(d_model=d_model, n_heads=2, n_centroids=3)
        self.attn2 = StochasticAttention(d_model=d_model, n_heads=2, tau=0.5)
        self.readout = PyroModule[torch.nn.Linear](d_model, 2)
        self.readout.weight = PyroSample(dist.Normal(0.0, 1.0).expand([2, d_model]).to_event(2))

    def forward(self, x, y=None):
        weight = self.readout.weight  # the global weight, drawn outside the data plate
        with pyro.plate("data", len(x)):
            h = x + self.attn1(x)  # attention sites attn1.a_c, attn1.a_v, attn2.a_v
            h = h + self.attn2(h)
            logits = h.mean(1) @ weight.T + self.readout.bias
            return pyro.sample("y", dist.Categorical(logits=logits), obs=y)


pyro.set_rng_seed(0)
x = torch.randn(400, 12, 16)
y = (x[:, :, 0].mean(1) > 0).long()  # the sign of feature 0, averaged over the sequence
model = SequenceClassifier()
trainable = probtrans.self_guided(model)  # attention integrated by its own distribution
guide = AutoNormal(trainable)  # a guide of the global weight only
svi = SVI(trainable, guide, pyro.optim.Adam({"lr": 0.02}), Trace_ELBO())
for step in range(301):
    loss = svi.step(x[:300], y[:300])
    if step % 100 == 0:
        print(f"step {step:3d}  loss {loss:8.1f}")

predictive = Predictive(model, guide=guide, num_samples=50, return_sites=["y", "attn2.a_v"])
draws = predictive(x[300:])  # y (50, 100); attn2.a_v (50, 100, 2, 12, 12)
idata = az.from_dict(posterior_predictive={"y": draws["y"][None]}, observed_data={"y": y[300:]})
accuracy = idata.posterior_predictive["y"].mean(("chain", "draw")).round() == y[300:].numpy()
print(f"held-out accuracy {float(accuracy.mean()):.2f}")
print(az.summary(idata.posterior_predictive, kind="stats").head(3))
