"""Row surgery on a transformers ``DynamicCache`` for continuous batching.

A running batch keeps one KV cache of shape ``(B, heads, T, head_dim)`` per layer, every row
left-padded to the batch's length ``T``; a ``(B, T)`` attention mask marks which columns hold a
row's own tokens. Rows join (their prefill's cache is padded to a common length and concatenated on
the batch axis), leave (``batch_select_indices``) and the columns no row uses any more are cut off
the left, so that a batch whose long rows left stops paying for their length.

Padding is always on the left of a row's tokens: positions are passed per row
(``position_ids``), so a row's keys carry its own rotary positions however far it is shifted, and
the mask hides the zeros in front of it.
"""

from __future__ import annotations

from typing import Protocol, cast

import torch
import torch.nn.functional as F
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


def merge(batch: DynamicCache, batch_mask: torch.Tensor, joining: DynamicCache,
          joining_mask: torch.Tensor) -> torch.Tensor:
    """Append ``joining``'s rows to ``batch`` (in place) and return the merged ``(B + n, T)`` mask.
    The shorter of the two is left-padded with zero keys that the mask hides."""
    t_batch, t_join = batch_mask.size(1), joining_mask.size(1)
    t = max(t_batch, t_join)
    for mine, theirs in zip(_layers(batch), _layers(joining), strict=True):
        mine.keys = torch.cat([_pad_left(mine.keys, t - t_batch), _pad_left(theirs.keys, t - t_join)])
        mine.values = torch.cat([_pad_left(mine.values, t - t_batch), _pad_left(theirs.values, t - t_join)])
    return torch.cat([F.pad(batch_mask, (t - t_batch, 0)), F.pad(joining_mask, (t - t_join, 0))])


def trim(cache: DynamicCache, mask: torch.Tensor) -> torch.Tensor:
    """Drop the leading columns that no row attends to (in place); return the trimmed mask."""
    used = mask.any(0)
    first = int(used.int().argmax()) if bool(used.any()) else 0
    if first == 0:
        return mask
    for layer in _layers(cache):
        layer.keys = layer.keys[:, :, first:]
        layer.values = layer.values[:, :, first:]
    return mask[:, first:]


def _layers(cache: DynamicCache) -> list[_Filled]:
    """The cache's layers, every one a filled ``DynamicLayer`` (ChatTTS's Llama has no other kind:
    no sliding window, no linear attention); anything else is a bug here, not a request's fault."""
    layers: list[_Filled] = []
    for layer in cache.layers:
        if not isinstance(layer, DynamicLayer) or layer.keys is None or layer.values is None:
            raise TypeError(f"continuous batching needs filled DynamicLayers, not {type(layer).__name__}")
        layers.append(cast(_Filled, layer))
    return layers


class _Filled(Protocol):
    keys: torch.Tensor
    values: torch.Tensor


def _pad_left(states: torch.Tensor, n: int) -> torch.Tensor:
    """``(B, heads, T, D)`` -> ``(B, heads, n + T, D)``, zeros in front."""
    return F.pad(states, (0, 0, n, 0)) if n else states
