"""Request rows for a served model: random valid rows from its sidecar, or a dataset's rows cycled to any batch size.

Every recipe's ``evaluate_latency`` (and the export checks) draw requests the same way from the sidecar's ``inputs``
(``recsys_serving.json``, see ``repository``: ``{name: {"dtype", "dims", "max_id", "min_id"}}``):

    floating input                  standard normal (the preprocessed numericals' range)
    id input with ``max_id``        uniform in ``[0, max_id)``; a list of bounds is one per column of the last dim
    id input, ``max_id`` null       uniform in ``[0, 2**20)`` (any id is valid, e.g. PyTorch DLRM ``--hash_indices``)
    ``min_id`` -1, several columns  multi-hot padded with -1: a random number (at least 1) of ids, then -1

    >>> rows = random_rows({"x": {"dtype": "float32", "dims": [2], "max_id": None},
    ...                     "ids": {"dtype": "int64", "dims": [3], "max_id": [5, 6, 7]}}, 4)
    >>> rows["x"].shape, rows["ids"].shape, bool((rows["ids"] < [5, 6, 7]).all())
    ((4, 2), (4, 3), True)

numpy only: this module is shared by the TensorFlow and PyTorch recipes.
"""
from __future__ import annotations

import os
from typing import Callable, Dict, Mapping, Union

import numpy as np
from .repository import read_sidecar

#: ids are drawn below this where the sidecar gives no bound (every id valid)
UNBOUNDED_IDS = 1 << 20
PAD = -1

MakeInputs = Callable[[int], Dict[str, np.ndarray]]


def random_rows(inputs: Mapping[str, Mapping], rows: int,
                seed: Union[int, np.random.Generator] = 0) -> Dict[str, np.ndarray]:
    """``rows`` random valid rows for ``inputs`` (a sidecar's ``inputs``), shaped ``[rows] + dims`` in each input's
    dtype, by the rules above. ``seed``: an int or a ``numpy.random.Generator`` (drawn from, so successive calls
    differ)."""
    rng = seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed)
    out: Dict[str, np.ndarray] = {}
    for name, entry in inputs.items():
        shape = (int(rows), *[int(d) for d in entry["dims"]])
        dtype = np.dtype(entry["dtype"])
        if dtype.kind == "f":
            out[name] = rng.standard_normal(shape).astype(dtype)
            continue
        bound = entry.get("max_id")
        high = np.asarray(UNBOUNDED_IDS if bound is None else bound, dtype=np.int64)
        ids = rng.integers(0, high, size=shape, dtype=np.int64)
        width = shape[-1] if len(shape) > 1 else 1
        if entry.get("min_id", 0) == PAD and width > 1:  # multi-hot: keep 1..width ids per row, pad the rest
            used = rng.integers(1, width + 1, size=shape[:-1])
            ids[np.arange(width) >= used[..., None]] = PAD
        out[name] = ids.astype(dtype)
    return out


def random_row_maker(inputs: Mapping[str, Mapping], seed: int = 0) -> MakeInputs:
    """``make_inputs(batch_size)`` returning fresh :func:`random_rows` on each call (one seeded generator)."""
    rng = np.random.default_rng(seed)
    return lambda batch_size: random_rows(inputs, batch_size, rng)


def sidecar_row_maker(model_repository: str, model_name: str, seed: int = 0) -> MakeInputs:
    """:func:`random_row_maker` of the sidecar of ``<model_repository>/<model_name>`` (``SidecarError`` if it is
    missing or malformed)."""
    return random_row_maker(read_sidecar(os.path.join(model_repository, model_name))["inputs"], seed)


def cycling_rows(pool: Mapping[str, np.ndarray]) -> MakeInputs:
    """``make_inputs(batch_size)``: the next ``batch_size`` rows of ``pool`` (arrays of one length), wrapping around,
    so a short split still fills any batch."""
    arrays = {name: np.asarray(array) for name, array in pool.items()}
    sizes = {len(a) for a in arrays.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"request rows: every input needs the same, non-zero number of rows, got "
                         f"{ {name: len(a) for name, a in arrays.items()} }")
    size = sizes.pop()
    state = {"next": 0}

    def make_inputs(batch_size: int) -> Dict[str, np.ndarray]:
        index = (state["next"] + np.arange(batch_size)) % size
        state["next"] = int((state["next"] + batch_size) % size)
        return {name: np.ascontiguousarray(array[index]) for name, array in arrays.items()}
    return make_inputs
