"""A run's trained network as a plain torch module (:meth:`probtrans.runs.Run.module`), and new
inputs prepared as the run's training inputs were (:meth:`probtrans.runs.Run.predict` uses the
same preparation)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

from probtrans.classifier import Classifier
from probtrans.data import DataBundle, DataSplit
from probtrans.data.rows import text_rows
from probtrans.data.tokenizer import pad_id
from probtrans.errors import ProbtransError


def new_inputs(
    data: DataBundle,
    inputs: list[str] | torch.Tensor | np.ndarray,
    what: str = "inputs",
    columns: Sequence[str] = (),
    first: int = 0,
) -> DataSplit:
    """New ``inputs`` as an unlabelled split of ``data``'s kind, prepared as its training inputs
    were: texts (or pairs of texts, as tuples) tokenised, token ids (N, L) with their padding mask,
    raw images (N, [C,] H, W) scaled and checked (:meth:`~probtrans.data.DataBundle.encode`); errors
    name them as ``what``. A table (a pandas DataFrame) holding the text ``columns`` of the run
    (``data.text_column``, and ``data.text_pair_column`` for pairs) gives them, by name. A bad
    text is named by its row counted from ``first`` (where ``inputs`` are a chunk of more)."""
    table = data.kind == "tokens" and hasattr(inputs, "columns")
    if table and columns and set(columns) <= set(inputs.columns):
        # by name, in the run's order: one column is its texts, two their pairs
        inputs = inputs[columns[0]] if len(columns) == 1 else inputs[list(columns)]
    if isinstance(inputs, str):
        raise ProbtransError(f"{what}: give a list of texts, not one string")
    if len(inputs) == 0:
        raise ProbtransError(f"{what}: nothing to predict")
    texts = text_rows(inputs, what) if data.kind == "tokens" else None
    if texts is not None or data.kind == "image":
        prepared, mask = data.encode(inputs if texts is None else texts, what, first)
        return DataSplit.unlabelled(prepared, mask)
    values = torch.as_tensor(np.asarray(inputs))
    if values.dim() != 2 or values.is_floating_point():
        raise ProbtransError(
            f"inputs of shape {tuple(values.shape)} ({values.dtype}): this run takes texts "
            f"or token ids (N, L)"
        )
    ids = values.long()
    padding = pad_id(data.tokenizer) if data.tokenizer is not None else 0
    return DataSplit.unlabelled(ids, ids != padding)


class TrainedNetwork(nn.Module):
    """A run's classifier with its random weights fixed (:meth:`Run.module`), taking new inputs
    as :meth:`Run.predict` does: ``network(inputs)`` with texts, token ids (N, L) or raw images
    (N, [C,] H, W), prepared and checked against the run's training inputs
    (:func:`new_inputs`: out-of-range images are refused) → logits (N, C). Inputs already
    prepared (``run.data.encode(...)``, a split's tensors) go to ``network.classifier(inputs,
    mask)``. ``state_dict``, ``parameters``, ``.to(device)`` and ``torch.compile`` see the
    classifier; the data set's preparation is not a parameter."""

    def __init__(
        self, classifier: Classifier, data: DataBundle, columns: Sequence[str] = ()
    ) -> None:
        super().__init__()
        self.classifier = classifier
        self.data = data  # its encoder (scaling, tokenizer); not a module
        self.columns = tuple(columns)  # the run's text columns, read by name from a DataFrame

    def forward(self, inputs: list[str] | torch.Tensor | np.ndarray) -> torch.Tensor:
        split = new_inputs(self.data, inputs, columns=self.columns)
        device = next(self.classifier.parameters()).device
        mask = None if split.mask is None else split.mask.to(device)
        return self.classifier(split.inputs.to(device), mask)
