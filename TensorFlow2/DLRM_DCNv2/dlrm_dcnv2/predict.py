"""Click probabilities for a user's rows from a checkpoint, without a server.

    python -m dlrm_dcnv2.predict --checkpoint /tmp/dlrm_dcnv2_quickstart/dlrm_checkpoint \\
        --dataset_path DIR [--feature_spec feature_spec.yaml] [--mapping test] --output predictions.csv

Reads split ``--mapping`` of the dataset that ``--feature_spec`` describes (split-binary, CSV or parquet chunks,
multi-hot parquet list columns; labels are not needed), scores every row with the checkpoint's model (rebuilt from
its ``state.json``, as ``deployment/deploy.py`` does) and writes one probability per row, in row order, atomically:

    .csv       a header ``probability`` then one value per line (9 significant digits: float32 exactly)
    .npy       float32 [rows]
    .parquet   one column ``probability``

An existing output is refused unless ``--overwrite``. Bad input is an error naming the file, feature and row: an id
outside ``[0, cardinality)``, a NaN/inf numerical, a spec that does not fit the checkpoint (feature count,
cardinality above the table's rows, hotness, numerical count); nothing is written then.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from dlrm_dcnv2 import serving
from dlrm_dcnv2.data.dataloader import load_spec, metadata_from_spec
from recsys_common.cli import InputError, exit_status
from recsys_common.io import add_prediction_flags, write_predictions

OUTPUT_FORMATS = (".csv", ".npy", ".parquet")


class PredictError(InputError):
    """A flag or input problem; the message names the flag, file, feature or row."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dlrm_dcnv2.predict", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True,
                   help="a step_<N> checkpoint of dlrm.py / dcnv2.py, or its --save_checkpoint_path (the newest)")
    p.add_argument("--dataset_path", required=True, help="directory of the rows to score (its feature spec)")
    p.add_argument("--feature_spec", default="feature_spec.yaml", help="feature spec, relative to --dataset_path")
    p.add_argument("--mapping", default="test", help="split of the feature spec's source_spec to score")
    add_prediction_flags(p, OUTPUT_FORMATS)
    return p


def pad_to(ids: np.ndarray, width: int) -> np.ndarray:
    """Multi-hot ids narrower than the model's hotness (a spec with a smaller max_hotness) padded with -1."""
    if ids.shape[1] == width:
        return ids
    padded = np.full((ids.shape[0], width), -1, np.int64)
    padded[:, :ids.shape[1]] = ids
    return padded


def predict(checkpoint: str, dataset_path: str, feature_spec: str = "feature_spec.yaml", mapping: str = "test",
            batch_size: int = 65536) -> np.ndarray:
    """Probabilities float32 ``[rows]`` of ``mapping`` of the dataset (see the module docstring)."""
    import tensorflow as tf  # late on purpose: flag and file errors cost no TensorFlow start-up
    spec = load_spec(dataset_path, feature_spec, "--feature_spec")
    if mapping not in spec.source_spec:
        raise PredictError(f"{spec.origin}: --mapping {mapping!r} is not a split of its source_spec (has: "
                           f"{', '.join(spec.source_spec)})")
    loaded = serving.load_checkpoint_model(checkpoint, spec)  # refuses a spec that does not fit, naming the feature
    meta = metadata_from_spec(spec)
    serve, _ = serving.monolithic_function(loaded)
    names = ([serving.NUMERICAL] if loaded.num_numerical else []) + \
        [serving.categorical_input(t) for t in range(len(loaded.table_sizes))]
    pieces: List[np.ndarray] = []
    for _, inputs in serving.read_feature_batches(spec, mapping, meta.categorical_features, meta.numerical_features,
                                          batch_size):
        for t, h in enumerate(loaded.hotness):
            key = serving.categorical_input(t)
            inputs[key] = pad_to(inputs[key], h)
        out = serve(*[tf.constant(inputs[n]) for n in names])[serving.PROBABILITY]
        pieces.append(out.numpy().reshape(-1))
    if not pieces:
        raise PredictError(f"{spec.origin}: split {mapping!r} has no rows")
    return np.concatenate(pieces).astype(np.float32)


def write_probabilities(path: str, probabilities: np.ndarray, overwrite: bool = False) -> None:
    """Write ``probabilities`` to ``path`` (format by extension) atomically; refuse an existing file unless
    ``overwrite``."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in OUTPUT_FORMATS:
        raise PredictError(f"--output {path}: unknown extension {ext!r}; use one of {', '.join(OUTPUT_FORMATS)}")
    if os.path.lexists(path) and not overwrite:
        raise PredictError(f"--output {path} exists; pass --overwrite to replace it")
    if os.path.isdir(path):
        raise PredictError(f"--output {path} is a directory")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    write_predictions(path, probabilities)


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Parse ``argv``, predict and write; returns ``{"output", "rows", "checkpoint"}``."""
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    if args.batch_size < 1:
        raise PredictError(f"--batch_size must be at least 1, got {args.batch_size}")
    if os.path.lexists(args.output) and not args.overwrite:  # before loading anything
        raise PredictError(f"--output {args.output} exists; pass --overwrite to replace it")
    probabilities = predict(args.checkpoint, args.dataset_path, args.feature_spec, args.mapping, args.batch_size)
    write_probabilities(args.output, probabilities, args.overwrite)
    return {"output": os.path.abspath(args.output), "rows": int(probabilities.size), "checkpoint": args.checkpoint}


def cli(argv: Optional[Sequence[str]] = None) -> int:
    """The command line's exit status (recsys_common.cli): 2 with one ``error:`` line for bad input (a flag, a file,
    a row), 1 with ``error: <class>: ...`` for a failure."""
    return exit_status(main, argv, prog="predict", failures=(ValueError, OSError), with_type=True,
                       report=lambda r: print(f"predict: {r['rows']} probabilities written to {r['output']}"))


if __name__ == "__main__":
    sys.exit(cli())
