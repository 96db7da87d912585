"""Embedding tables as plain float32 tensors: their initial values and their (pooled) lookup.

Initialisation follows NVIDIA's TF2 DLRM/DCNv2 ``EmbeddingInitializer``: every entry of a table with ``n`` rows is
drawn from U(-sqrt(1/n), sqrt(1/n)) (``n`` = rows of the *whole* table, also for a slice of it). Ours draws the
table in fixed blocks of :data:`INIT_BLOCK_ROWS` rows, each from its own generator seeded by
``(seed, table, block)``: any row or column slice of a table is then exactly the slice of the one-rank table, so
a run on N ranks starts from the same model as a run on one, and no rank ever materialises more of a table than
its own rows.

Lookup (``embedding_lookup``): ids of shape ``[batch]`` (one-hot) give ``table[ids]``; ids of shape
``[batch, hotness]`` (multi-hot, padded with ``-1``) give the sum of the rows of the non-negative ids (sum pooling;
an all-padding row gives zeros). For a row slice holding table rows ``[start, stop)``, ids outside that range give
zeros, so the slices' results add up to the lookup in the whole table. The gradient with respect to the table is
a ``tf.IndexedSlices`` (only the rows looked up), which the lazy Adam optimizer needs. In it, padding and ids
outside the slice have the index ``-1`` (:data:`NO_ROW`) and a zero value: the lookup reads local row 0 for
them (static shapes, so it compiles under XLA), but they touch no row, and the embedding optimizers
(``model.optimizers``) skip negative indices. Were they index 0, lazy Adam would count row 0 as touched and give it
a momentum-only update every step, and N ranks (whose row slices each have a row 0) would no longer train as one.
"""
from __future__ import annotations

import math
from typing import Iterator, Optional, Tuple

import numpy as np
import tensorflow as tf

INIT_BLOCK_ROWS = 65536
NO_ROW = -1  # the gradient index of a looked-up id that is no row of the table (padding, outside the slice)


def initial_value_blocks(table_rows: int, dim: int, seed: int, table: int, rows=None,
                         cols=None) -> Iterator[Tuple[int, np.ndarray]]:
    """Initial float32 values of rows ``rows=(start, stop)`` and columns ``cols`` of table ``table``, in pieces.

    Yields ``(offset, values)``: ``values`` are rows ``start + offset ...`` of the slice, at most
    :data:`INIT_BLOCK_ROWS` of them, so a caller filling a variable never holds a second copy of a large table.
    ``table_rows``/``dim``: the whole table's shape (the scale sqrt(1/table_rows) is the whole table's).
    Deterministic in ``(seed, table)``; independent of how the table is sliced.
    """
    start, stop = rows if rows is not None else (0, table_rows)
    col_start, col_stop = cols if cols is not None else (0, dim)
    if not (0 <= start <= stop <= table_rows and 0 <= col_start <= col_stop <= dim):
        raise ValueError(f"slice rows {start}:{stop} cols {col_start}:{col_stop} is outside table {table} "
                         f"of shape [{table_rows}, {dim}]")
    bound = np.float32(math.sqrt(1.0 / table_rows))
    first, last = start // INIT_BLOCK_ROWS, (stop - 1) // INIT_BLOCK_ROWS
    for block in range(first, last + 1 if stop > start else first):
        block_start = block * INIT_BLOCK_ROWS
        block_rows = min(INIT_BLOCK_ROWS, table_rows - block_start)
        rng = np.random.Generator(np.random.PCG64([int(seed), int(table), int(block)]))
        values = rng.random((block_rows, dim), dtype=np.float32)
        values = values * (2 * bound) - bound
        lo, hi = max(start, block_start), min(stop, block_start + block_rows)
        yield lo - start, values[lo - block_start:hi - block_start, col_start:col_stop]


def initial_values(table_rows: int, dim: int, seed: int, table: int, rows=None, cols=None,
                   zeros: bool = False) -> np.ndarray:
    """The whole slice of :func:`initial_value_blocks` as one array (``zeros``: NVIDIA's
    ``--embedding_zeros_initializer``)."""
    start, stop = rows if rows is not None else (0, table_rows)
    col_start, col_stop = cols if cols is not None else (0, dim)
    out = np.zeros((stop - start, col_stop - col_start), dtype=np.float32)
    if zeros:
        return out
    for offset, values in initial_value_blocks(table_rows, dim, seed, table, rows, cols):
        out[offset:offset + len(values)] = values
    return out


def embedding_lookup(table, ids, row_start: int = 0, row_count: Optional[int] = None):
    """Pooled lookup of ``ids`` in ``table`` (a variable or tensor ``[rows, cols]``) -> float32 ``[batch, cols]``.

    ``ids``: int tensor ``[batch]`` (one-hot) or ``[batch, hotness]`` (multi-hot, ``-1`` = padding, summed over
    the other ids). ``row_start``/``row_count``: ``table`` holds rows ``[row_start, row_start + row_count)`` of the
    full table; other ids give zeros. ``row_count=None``: ``table`` is the whole table.
    """
    ids = tf.convert_to_tensor(ids)
    multi_hot = ids.shape.rank == 2
    if ids.shape.rank not in (1, 2):
        raise ValueError(f"embedding ids must have shape [batch] or [batch, hotness], got {ids.shape}")
    if row_count is None and not multi_hot:
        return tf.gather(table, ids)  # the fast path: one-hot lookup in a whole table
    local = ids - row_start if row_start else ids
    valid = local >= 0
    if row_count is not None:
        valid = tf.logical_and(valid, local < row_count)
        if row_start:
            valid = tf.logical_and(valid, ids >= 0)  # padding (-1) stays padding whatever the offset
    rows = _masked_gather(table, local, valid)
    return tf.reduce_sum(rows, axis=1) if multi_hot else rows


def _masked_gather(table, local, valid):
    """``table[local]`` where ``valid``, zeros elsewhere; the gradient of the table indexes the invalid entries
    :data:`NO_ROW` (see the module docstring)."""
    safe = tf.where(valid, local, tf.zeros_like(local))
    mask = tf.cast(valid, table.dtype)[..., tf.newaxis]
    gradient_indices = tf.reshape(tf.where(valid, local, tf.fill(tf.shape(local), tf.constant(NO_ROW, local.dtype))),
                                  [-1])

    def table_gradient(upstream):
        values = tf.reshape(upstream * tf.cast(mask, upstream.dtype), [-1, tf.shape(upstream)[-1]])
        return tf.IndexedSlices(values, gradient_indices, tf.shape(table, out_type=gradient_indices.dtype))

    if isinstance(table, tf.Variable):
        # The variable is read inside (a gather on the resource, no copy of the table): its gradient is returned
        # through ``variables``, as tf.custom_gradient asks for variables the function reads.
        @tf.custom_gradient
        def gather(anchor):
            def backward(upstream, variables=None):
                if variables is None or len(variables) != 1:
                    raise ValueError(f"embedding lookup expected to read one variable, read {variables}")
                return tf.zeros_like(anchor), [table_gradient(upstream)]
            return tf.gather(table, safe) * mask, backward
        return gather(tf.zeros([], table.dtype))

    @tf.custom_gradient
    def gather_tensor(values):
        return tf.gather(values, safe) * mask, table_gradient
    return gather_tensor(table)
