"""Pretrained Hugging Face transformers as probtrans backbones.

- :mod:`~probtrans.backbone.swap` — probtrans attention swapped into the pretrained
  self-attention blocks through Hugging Face's attention-function registry;
- :mod:`~probtrans.backbone.lora` — low-rank adapters of the backbone's linear maps, whose
  factors can carry priors (Bayesian LoRA).

A backbone is found and loaded by :mod:`probtrans.hub` (hub id or folder, ``transformers``'
auto classes, offline-safe); the classifier around it is
:class:`probtrans.classifier.BackboneClassifier`.
"""
