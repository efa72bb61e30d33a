"""A pretrained Hugging Face model made Bayesian in your own Pyro model: H-STO attention
(Pei et al. 2022) swapped into its top block by ``probtrans.swap_attention``, a Bayesian
read-out, SVI, and the posterior predictive of new texts.

    python examples/pretrained_model.py [MODEL]

MODEL: a hub id (default ``bert-base-uncased``, fetched once into the Hugging Face cache) or a
folder written by ``save_pretrained``.
"""

import sys

import pyro
import pyro.distributions as dist
import torch
from pyro import poutine
from pyro.infer import SVI, Predictive, Trace_ELBO
from pyro.infer.autoguide import AutoNormal
from pyro.nn import PyroModule, PyroSample
from transformers import AutoModel, AutoTokenizer

import probtrans

name = sys.argv[1] if len(sys.argv) > 1 else "bert-base-uncased"
tokenizer = AutoTokenizer.from_pretrained(name)
backbone = AutoModel.from_pretrained(name)
backbone.requires_grad_(False)  # frozen; the swapped layer's centroids and the read-out train
# STO logits carry no 1/sqrt(d_head) scaling: tau = sqrt(64) keeps BERT-base's softmax scale
encoder = probtrans.swap_attention(backbone, layers=[-1], attention="h_sto", tau1=8.0, tau2=8.0)


class Sentiment(PyroModule):
    """Texts → 2 classes: the pretrained encoder's [CLS] token, a Bayesian linear read-out."""

    def __init__(self, encoder: PyroModule) -> None:
        super().__init__()
        self.encoder = encoder  # its sites: encoder.model.encoder.layer.11.attention.self.attn.*
        width = encoder.model.config.hidden_size
        self.readout = PyroModule[torch.nn.Linear](width, 2)
        self.readout.weight = PyroSample(dist.Normal(0.0, 1.0).expand([2, width]).to_event(2))

    def forward(self, ids, mask, y=None):
        weight = self.readout.weight  # the global weight, drawn outside the data plate
        with pyro.plate("data", len(ids)):
            h = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state[:, 0]
            logits = h @ weight.T + self.readout.bias
            return pyro.sample("y", dist.Categorical(logits=logits), obs=y)


texts = [
    "a wonderful film with great actors",
    "I loved this beautiful story",
    "an excellent , clever and funny script",
    "a dull and boring movie",
    "the worst acting I have ever seen",
    "bad direction and a weak ending",
]
labels = torch.tensor([1, 1, 1, 0, 0, 0])
batch = tokenizer(texts, padding=True, return_tensors="pt")

pyro.set_rng_seed(0)
model = Sentiment(encoder)
sites = poutine.trace(model).get_trace(batch["input_ids"], batch["attention_mask"]).nodes
print("attention sites:", ", ".join(s for s in sites if s.endswith((".a_c", ".a_v"))))
trainable = probtrans.self_guided(model)  # attention integrated by its own distribution
guide = AutoNormal(trainable, init_scale=0.01)  # a guide of the read-out's weight
svi = SVI(trainable, guide, pyro.optim.Adam({"lr": 0.01}), Trace_ELBO())
for step in range(101):
    loss = svi.step(batch["input_ids"], batch["attention_mask"], labels)
    if step % 50 == 0:
        print(f"step {step:3d}  loss {loss:7.2f}")

queries = ["a great and funny film", "a boring , weak movie"]
new = tokenizer(queries, padding=True, return_tensors="pt")
draws = Predictive(model, guide=guide, num_samples=50, return_sites=["y"])(
    new["input_ids"], new["attention_mask"]
)["y"]  # (50, 2): posterior draws of the read-out × attention samples
for text, positive in zip(queries, draws.float().T, strict=True):
    print(f"{text!r}: positive in {positive.mean():.0%} of 50 predictive draws")
