"""Mixed precision: training may run a model under ``torch.autocast`` (bfloat16); the parts that
must not be rounded to bfloat16 (SGPA's kernel matrices, Cholesky factors and GP conditionals,
the Gaussian-mixture units, SNGP's spectral norm and random features, the classifier's logits)
leave it with :func:`autocast_off` and compute in :func:`full_precision`."""

from __future__ import annotations

import torch
from torch import Tensor


def full_precision(x: Tensor) -> Tensor:
    """``x`` in float32, or as it is if it is wider (float64): a bfloat16 or float16 tensor of an
    autocast region comes back in float32."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def autocast_off(x: Tensor) -> torch.autocast:
    """A block in which autocast is off on the device type of ``x``: its operations run in the
    dtype of their inputs (made :func:`full_precision`), even inside an autocast region."""
    return torch.autocast(x.device.type, enabled=False)
