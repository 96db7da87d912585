"""``python predict.py`` (NVIDIA's command name; this file is ``deployment/predict.py``): click probabilities for a user's rows from a checkpoint, without a server.

    python predict.py --checkpoint-dir /tmp/wide_deep_quickstart/model --dataset_path /tmp/wide_deep_quickstart/data \\
        --embedding_sizes_file /tmp/wide_deep_quickstart/embedding_sizes.json --deep_hidden_units 32 32 \\
        --input rows.parquet --output probabilities.csv

Input, in the recipe's format (the ETL's parquet columns): one column per feature of the training feature spec
(other columns, e.g. ``clicked``, are ignored; ``display_id`` is copied to the output when present).
  - parquet: one-hot ids and numericals as numbers, multi-hot features as list columns (the ETL's own files work);
  - CSV with a header row: the same columns; a multi-hot cell holds its ids separated by spaces (empty: no ids).
Every row is checked before the model runs: a missing column, a value that is not a number, an id outside
``[0, cardinality)``, a list longer than ``max_hotness`` or a numerical that is not finite is an error naming the
file, the data row (1-based) and the feature; exit status 2, nothing written.
Output: ``.csv`` (``probability`` column, after ``display_id`` when the input has one) or ``.npy`` (float32),
written atomically (``--overwrite`` to replace an existing file).
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from typing import Dict, Optional, Sequence

import numpy as np
import pyarrow.parquet as pq
import tensorflow as tf

from recsys_common.cli import InputError, exit_status
from recsys_common.io import add_prediction_flags, write_predictions
from wide_deep.serving import ServingInput, model_from_args, model_parser, serving_inputs, to_model_inputs

DISPLAY_ID = "display_id"


class InputRowError(InputError):
    """A bad value in the user's file (the message names file, row and feature)."""


def read_table(path: str) -> Dict[str, list]:
    """``{column: list of Python values}`` of a parquet or CSV file (CSV: every cell a string)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"--input {path}: no such file")
    if path.endswith((".parquet", ".pq")):
        try:
            return pq.read_table(path).to_pydict()
        except Exception as e:  # pyarrow raises several types for a corrupt file
            raise InputRowError(f"{path}: not a readable parquet file ({e})") from None
    if path.endswith(".csv"):
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.reader(f)
            header = next(reader, None)
            if not header:
                raise InputRowError(f"{path}: empty CSV (a header row naming the features is required)")
            columns: Dict[str, list] = {name: [] for name in header}
            for row_number, row in enumerate(reader, start=1):
                if len(row) != len(header):
                    raise InputRowError(f"{path}: data row {row_number} has {len(row)} fields, the header has "
                                        f"{len(header)}")
                for name, value in zip(header, row):
                    columns[name].append(value)
        return columns
    raise InputRowError(f"--input {path}: expected a .parquet or .csv file")


def _as_int(value, path: str, row: int, name: str) -> int:
    try:
        if isinstance(value, str):
            return int(value.strip())
        if isinstance(value, float) and not value.is_integer():
            raise ValueError
        return int(value)
    except (TypeError, ValueError):
        raise InputRowError(f"{path}: data row {row}, feature {name!r}: {value!r} is not an integer id") from None


def rows_to_arrays(table: Dict[str, list], inputs: Sequence[ServingInput], path: str) -> Dict[str, np.ndarray]:
    """Check every row of ``table`` against ``inputs`` (see the module docstring) and return the serving arrays
    (``[N, 1]`` / ``[N, max_hotness]`` padded with -1). Raises InputRowError naming file, row and feature."""
    missing = [s.name for s in inputs if s.name not in table]
    if missing:
        raise InputRowError(f"{path}: column(s) {missing} of the feature spec are missing (the file has "
                            f"{sorted(table)})")
    n = len(table[inputs[0].name])
    if n == 0:
        raise InputRowError(f"{path}: no rows")
    out = {}
    for s in inputs:
        values = table[s.name]
        if s.kind == "numerical":
            arr = np.empty((n, 1), np.float32)
            for i, v in enumerate(values):
                try:
                    x = float(v)
                except (TypeError, ValueError):
                    x = float("nan")
                if not math.isfinite(x):
                    raise InputRowError(f"{path}: data row {i + 1}, feature {s.name!r}: {v!r} is not a finite number")
                arr[i, 0] = x
        else:
            width = s.dims[0]
            arr = np.full((n, width), -1, np.int64)
            for i, v in enumerate(values):
                if s.kind == "onehot":
                    ids = [_as_int(v, path, i + 1, s.name)]
                else:
                    items = (v.split() if isinstance(v, str) else (v or []))
                    ids = [_as_int(x, path, i + 1, s.name) for x in items]
                    if len(ids) > width:
                        raise InputRowError(f"{path}: data row {i + 1}, feature {s.name!r}: {len(ids)} ids, more than "
                                            f"its max_hotness {width}")
                for j, x in enumerate(ids):
                    if not 0 <= x < s.max_id:
                        raise InputRowError(f"{path}: data row {i + 1}, feature {s.name!r}: id {x} is out of range "
                                            f"[0, {s.max_id}) (its cardinality in the feature spec)")
                    arr[i, j] = x
            arr = arr.astype(s.dtype)
        out[s.name] = arr
    return out


def predict_probabilities(model, inputs: Sequence[ServingInput], arrays: Dict[str, np.ndarray],
                          batch_size: int) -> np.ndarray:
    """sigmoid(model) for every row of ``arrays`` (serving layout), in batches; float32 ``[N]``."""
    fn = tf.function(lambda f: tf.sigmoid(model(to_model_inputs(f, inputs), training=False)), reduce_retracing=True)
    n = len(next(iter(arrays.values())))
    parts = [fn({k: tf.constant(v[i:i + batch_size]) for k, v in arrays.items()}).numpy()
             for i in range(0, n, batch_size)]
    return np.concatenate(parts).astype(np.float32)


def build_parser() -> argparse.ArgumentParser:
    p = model_parser("predict.py", __doc__)
    g = p.add_argument_group("rows and output")
    g.add_argument("--input", required=True, help="the rows to score: .parquet or .csv (see the description)")
    add_prediction_flags(g, (".csv", ".npy"))
    return p


def score(argv: Optional[Sequence[str]] = None) -> Dict[str, object]:
    """Score ``--input``; returns ``{"rows", "output", "mean_probability"}``. Raises ``InputError`` (flags),
    ``InputRowError``, ``FileNotFoundError`` or ``ValueError`` on bad input."""
    args = build_parser().parse_args(argv)
    if args.batch_size < 1:
        raise InputError(f"--batch_size must be at least 1, got {args.batch_size}")
    if not args.output.endswith((".csv", ".npy")):
        raise InputError(f"--output {args.output}: expected a .csv or .npy file name")
    if os.path.exists(args.output) and not args.overwrite:
        raise InputError(f"--output {args.output} exists; pass --overwrite to replace it")
    table = read_table(args.input)  # checked before the model is loaded: bad rows fail fast
    model, config, spec = model_from_args(args)
    inputs = serving_inputs(config, spec)
    arrays = rows_to_arrays(table, inputs, args.input)
    probabilities = predict_probabilities(model, inputs, arrays, args.batch_size)
    write_predictions(args.output, probabilities, table.get(DISPLAY_ID), DISPLAY_ID)
    print(f"[predict] {len(probabilities)} rows -> {args.output} (mean probability {probabilities.mean():.4f})")
    return {"rows": int(len(probabilities)), "output": args.output, "mean_probability": float(probabilities.mean())}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """The command line's exit status (recsys_common.cli): 0, or 2 with one ``error:`` line for bad input."""
    return exit_status(score, argv, prog="predict.py", input_errors=(InputRowError, FileNotFoundError, ValueError))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
