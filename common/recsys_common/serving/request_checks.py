"""Checks of a decoded inference request against a model (numpy only; used by the MLServer runtime, testable
without mlserver).

    >>> import numpy as np
    >>> expected = {"cat": {"datatype": "INT64", "shape": ["batch", 2]}}
    >>> check_request_arrays({"cat": np.array([[1, 7]])}, {"cat": "INT64"}, expected, {"cat": [5, 10]})
    >>> check_request_arrays({"cat": np.array([[1, 7]])}, {"cat": "INT64"}, expected, {"cat": [5, 6]})
    Traceback (most recent call last):
    ...
    ValueError: input 'cat': id 7 (row 0, column 1) is out of range; ids must be in [0, 6)
"""
from __future__ import annotations

from typing import Dict, Optional, Sequence, Union

import numpy as np

MaxId = Optional[Union[int, Sequence[int]]]


def check_request_arrays(arrays: Dict[str, np.ndarray], datatypes: Dict[str, str], expected: Dict[str, dict],
                         max_ids: Dict[str, MaxId], min_ids: Optional[Dict[str, int]] = None) -> None:
    """Check decoded request inputs against the model; raise ``ValueError`` with a message naming the input.

    Args:
        arrays: {input name: array} as decoded from the request.
        datatypes: {input name: the request's KServe datatype}.
        expected: {input name: {"datatype": KServe datatype, "shape": ONNX shape (ints, or None/str for free dims)}}.
        max_ids: {input name: max_id (int, or a list: one bound per column of the last dimension) or None};
            ids must be in [0, max_id).
        min_ids: {input name: lowest allowed id} (the sidecar's ``min_id``, default 0): -1 where an input holds
            multi-hot ids padded with -1 (TF2 DLRM_DCNv2), so the padding is not refused.
    """
    missing = [n for n in expected if n not in arrays]
    if missing:
        raise ValueError(f"missing input(s) {missing}; the model takes {sorted(expected)}")
    unknown = [n for n in arrays if n not in expected]
    if unknown:
        raise ValueError(f"unknown input(s) {unknown}; the model takes {sorted(expected)}")
    batch = None
    for name, spec in expected.items():
        array = arrays[name]
        if datatypes[name] != spec["datatype"]:
            raise ValueError(f"input {name!r}: expected datatype {spec['datatype']}, got {datatypes[name]}")
        shape = spec["shape"]
        if array.ndim != len(shape):
            raise ValueError(f"input {name!r}: expected shape {_show_shape(shape)} (rank {len(shape)}), got "
                             f"{list(array.shape)}")
        for axis, (want, got) in enumerate(zip(shape, array.shape)):
            if isinstance(want, int) and want > 0 and want != got:
                raise ValueError(f"input {name!r}: expected shape {_show_shape(shape)}, got {list(array.shape)} "
                                 f"(dimension {axis})")
        if array.ndim and batch is not None and array.shape[0] != batch[1]:
            raise ValueError(f"input {name!r}: batch size {array.shape[0]} differs from input {batch[0]!r}'s "
                             f"{batch[1]}")
        if array.ndim and batch is None:
            batch = (name, array.shape[0])
        max_id = max_ids.get(name)
        if max_id is not None and array.size:
            # one bound for the whole input, or one per column of its last dimension
            bounds = np.asarray(max_id, dtype=np.int64)
            if bounds.ndim == 1 and array.shape[-1] != len(bounds):
                raise ValueError(f"input {name!r}: {array.shape[-1]} columns, the model has {len(bounds)} id bounds")
            low = int((min_ids or {}).get(name) or 0)
            bad = (array < low) | (array >= bounds)
            if bad.any():
                where = tuple(int(i) for i in np.argwhere(bad)[0])
                limit = int(bounds) if bounds.ndim == 0 else int(bounds[where[-1]])
                column = "" if bounds.ndim == 0 else f", column {where[-1]}"
                raise ValueError(f"input {name!r}: id {int(array[where])} (row {where[0]}{column}) is out of range; "
                                 f"ids must be in [{low}, {limit})")


def _show_shape(shape) -> str:
    return "[" + ", ".join(str(d) if isinstance(d, int) and d > 0 else "B" if i == 0 else "?"
                           for i, d in enumerate(shape)) + "]"
