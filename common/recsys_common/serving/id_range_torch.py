"""The id range check inside exported PyTorch models (TorchScript, and ONNX through ``torch.onnx.export``).

Why in the graph: ONNX's ``Gather`` wraps a negative id into ``[-size, -1]`` and GPU gathers return zeros (or fault)
for an id past the table, so on a real Triton server a bad id would silently give a wrong score. The exported module
instead looks up row 0 for an out-of-range id (a lookup that is valid on every device and backend) and scores the
whole request row NaN: the model itself flags the row, on any server.

    safe, row_ok = checked_ids(ids, upper)       # ids [B, T] int64, upper: int or [T] sizes
    probability = flag_rows(model(safe), row_ok) # [B, 1]; NaN where a row held an id outside [lower, upper)

Both functions are TorchScript-compatible (``torch.jit.script`` compiles them with the calling module) and export
to ONNX (``Where``, ``ReduceMin``).
"""
from typing import Tuple

import torch


def checked_ids(ids: torch.Tensor, upper: torch.Tensor, lower: int = 0) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(ids with every one outside [lower, upper) replaced by 0, row_ok [B] bool)``; ``upper`` broadcasts against
    ``ids`` (a scalar tensor, or one bound per column of the last dimension)."""
    valid = (ids >= lower) & (ids < upper)
    safe = torch.where(valid, ids, torch.zeros_like(ids))
    return safe, valid.reshape(ids.shape[0], -1).all(dim=1)


def flag_rows(probability: torch.Tensor, row_ok: torch.Tensor) -> torch.Tensor:
    """``probability`` [B, 1] with NaN in the rows where ``row_ok`` is False."""
    return torch.where(row_ok.reshape(-1, 1), probability, torch.full_like(probability, float("nan")))
