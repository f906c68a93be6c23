"""Which keys a query may see, as small tensors or (for references at small N) dense patterns.

b - batch, h - heads, i - query position, j - key position
"""

from __future__ import annotations

import torch
from torch import Tensor


def allowed_keys(
    n_q: int,
    n_k: int,
    *,
    causal: bool,
    key_padding_mask: Tensor | None,
    device: torch.device | str = "cpu",
    query_offset: int = 0,
) -> Tensor:
    """Dense (b or 1, 1, i, j) bool, True where query `query_offset + i` may see key j.

    Quadratic in size: for references and checks, never for a sub-quadratic variant's forward pass.
    """
    rows = torch.arange(query_offset, query_offset + n_q, device=device)[:, None]  # (i, 1)
    cols = torch.arange(n_k, device=device)[None, :]  # (1, j)
    allowed = (cols <= rows) if causal else torch.ones(n_q, n_k, dtype=torch.bool, device=device)
    allowed = allowed[None, None]  # (1, 1, i, j)
    if key_padding_mask is not None:
        allowed = allowed & ~key_padding_mask[:, None, None, :]  # (b, 1, i, j)
    return allowed


def rows_with_visible_key(
    batch: int, n_q: int, *, causal: bool, key_padding_mask: Tensor | None, device: torch.device | str = "cpu"
) -> Tensor | None:
    """(b, 1, i, 1) bool, True where query i sees at least one key; None when every query does.

    O(b * (i + j)): used by variants to zero rows that see nothing (the interface's convention).
    """
    if key_padding_mask is None:
        return None  # with no padding, every query sees key 0 (causal) or all keys
    real = ~key_padding_mask  # (b, j)
    any_real = real.any(dim=-1)  # (b,)
    if not causal:
        visible = any_real[:, None].expand(batch, n_q)
    else:
        first_real = torch.where(any_real, real.int().argmax(dim=-1), torch.full_like(any_real, n_q, dtype=torch.long))
        visible = torch.arange(n_q, device=device)[None, :] >= first_real[:, None]  # (b, i)
    if bool(visible.all()):
        return None
    return visible[:, None, :, None]
