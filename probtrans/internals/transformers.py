"""Every private ``transformers`` name that probtrans relies on, in one place.

``transformers`` does not promise these names across releases, so each is wrapped here, once,
and ``tests/test_transformers_internals.py`` checks that each still behaves as used and fails on
a ``transformers`` release (major.minor) not in :data:`CHECKED_TRANSFORMERS_VERSIONS` (then
re-check each function below against that release's source and add it). Nothing else in
probtrans imports a private ``transformers`` name. ``transformers`` is imported on first use,
never with probtrans.

- :func:`attention_implementation`: the attention function a model's config names
  (``config._attn_implementation``, which the public ``set_attn_implementation`` sets).
- :func:`sdpa_attention`: ``transformers``' own scaled dot-product attention function
  (``transformers.integrations.sdpa_attention.sdpa_attention_forward``), what the blocks of a
  swapped model that hold no probtrans layer run.
- :func:`register_attention`: a function added to the attention registry (the public
  ``AttentionInterface``) with scaled dot-product attention's mask
  (``transformers.masking_utils.AttentionMaskInterface`` and ``sdpa_mask``).
- :func:`calls_attention_registry`: whether a self-attention module's ``forward`` calls the
  function of the registry that the config names (its source reads
  ``ALL_ATTENTION_FUNCTIONS``), so that a function registered there is used.
- :func:`progress_bars_off`: ``transformers``' progress bars off in a block
  (``transformers.utils.logging.set_tqdm_hook``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn

#: the ``transformers`` releases (major.minor) whose source the functions below were checked
#: against
CHECKED_TRANSFORMERS_VERSIONS = ("5.24", "5.25")


def attention_implementation(config: Any) -> str:
    """The name of the attention function ``config`` (a model's) names."""
    return config._attn_implementation


def sdpa_attention(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """``transformers``' scaled dot-product attention function, called as the registry calls
    an attention function: (module, query, key, value, attention_mask, scaling=, dropout=,
    ...) → (output (B, L, H, d), weights or None)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, *args, **kwargs)


def register_attention(name: str, function: Callable[..., Any]) -> None:
    """Add ``function`` to the attention registry as ``name``, with scaled dot-product
    attention's mask (again is harmless)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, sdpa_mask)


def calls_attention_registry(module: nn.Module) -> bool:
    """Whether the self-attention ``module`` calls the function of the attention registry that
    its config names, as its ``forward``'s source reads (True where there is no source to
    read)."""
    try:
        source = inspect.getsource(type(module).forward)
    except (OSError, TypeError):
        return True
    return "ALL_ATTENTION_FUNCTIONS" in source


@contextmanager
def progress_bars_off() -> Iterator[None]:
    """``transformers``' progress bars (its "Loading weights" bar on stderr) off inside the
    block, whatever hook was set before, which is set again after."""
    from transformers.utils.logging import set_tqdm_hook

    def quiet(factory: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
        kwargs = {**kwargs, "disable": True}
        return factory(*args, **kwargs) if previous is None else previous(factory, args, kwargs)

    previous = set_tqdm_hook(quiet)
    try:
        yield
    finally:
        set_tqdm_hook(previous)
