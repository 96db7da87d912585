"""Click probabilities for a user's rows from a checkpoint, without a server.

    python -m dlrm_dcnv2.scripts.predict --checkpoint /tmp/dlrm_dcnv2_quickstart/dlrm_checkpoint \\
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

from recsys_common.io import add_prediction_flags

OUTPUT_FORMATS = (".csv", ".npy", ".parquet")


class PredictError(ValueError):
    """A flag or input problem; the message names the flag, file, feature or row."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dlrm_dcnv2.scripts.predict", description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True,
                   help="a step_<N> checkpoint of dlrm.py / dcnv2.py, or its --save_checkpoint_path (the newest)")
    p.add_argument("--dataset_path", required=True, help="directory of the rows to score (its feature spec)")
    p.add_argument("--feature_spec", default="feature_spec.yaml", help="feature spec, relative to --dataset_path")
    p.add_argument("--mapping", default="test", help="split of the feature spec's source_spec to score")
    add_prediction_flags(p, OUTPUT_FORMATS)
    return p


def read_feature_batches(spec, mapping: str, categorical: Sequence[str], numerical: Sequence[str],
                         batch_size: int):
    """Yield ``(first_row, {serving input name: array})`` batches of ``mapping``: ``numerical`` float32 [b, n],
    ``cat_<t>`` int64 [b, hotness] (padded with -1). Ids are range-checked per batch (``DatasetError`` naming the
    file, feature and row); numericals must be finite."""
    from recsys_common.datasets import DatasetError, open_reader
    from deployment.export import NUMERICAL, categorical_input
    channels = [ch for ch in spec.channel_spec if "label" not in ch.lower() and spec.channel_spec[ch]]
    reader = open_reader(spec, mapping, batch_size, channels=channels, check_values=True)
    position = {name: t for t, name in enumerate(categorical)}
    for index in range(reader.num_batches_total):
        batch = reader.read_batch(index)
        first = index * batch_size
        columns: Dict[str, np.ndarray] = {}
        for ch in channels:
            names, value = spec.channel_spec[ch], batch[ch]
            for j, name in enumerate(names):
                columns[name] = value[j] if isinstance(value, list) else value[:, j]
        out: Dict[str, np.ndarray] = {}
        if numerical:
            values = np.stack([np.asarray(columns[n], np.float32) for n in numerical], axis=1)
            if not np.isfinite(values).all():
                row, col = (int(x[0]) for x in np.nonzero(~np.isfinite(values)))
                source = spec.resolve_file(spec.chunk_of_feature(mapping, numerical[col])["files"][0])
                raise DatasetError(f"{source}: numerical feature {numerical[col]!r} row {first + row} is "
                                   f"{values[row, col]} (NaN/inf)")
            out[NUMERICAL] = values
        for name in categorical:
            ids = np.asarray(columns[name], np.int64)
            out[categorical_input(position[name])] = ids.reshape(len(ids), -1)
        yield first, out


def _pad_to(ids: np.ndarray, width: int) -> np.ndarray:
    """Multi-hot ids narrower than the model's hotness (a spec with a smaller max_hotness) padded with -1."""
    if ids.shape[1] == width:
        return ids
    padded = np.full((ids.shape[0], width), -1, np.int64)
    padded[:, :ids.shape[1]] = ids
    return padded


def predict(checkpoint: str, dataset_path: str, feature_spec: str = "feature_spec.yaml", mapping: str = "test",
            batch_size: int = 65536) -> np.ndarray:
    """Probabilities float32 ``[rows]`` of ``mapping`` of the dataset (see the module docstring)."""
    import tensorflow as tf
    from dlrm_dcnv2.dataloading.dataloader import load_spec, metadata_from_spec
    from deployment import export
    spec = load_spec(dataset_path, feature_spec, "--feature_spec")
    if mapping not in spec.source_spec:
        raise PredictError(f"{spec.origin}: --mapping {mapping!r} is not a split of its source_spec (has: "
                           f"{', '.join(spec.source_spec)})")
    loaded = export.load_checkpoint_model(checkpoint, spec)  # refuses a spec that does not fit, naming the feature
    meta = metadata_from_spec(spec)
    serve, _ = export.monolithic_function(loaded)
    names = ([export.NUMERICAL] if loaded.num_numerical else []) + \
        [export.categorical_input(t) for t in range(len(loaded.table_sizes))]
    pieces: List[np.ndarray] = []
    for _, inputs in read_feature_batches(spec, mapping, meta.categorical_features, meta.numerical_features,
                                          batch_size):
        for t, h in enumerate(loaded.hotness):
            key = export.categorical_input(t)
            inputs[key] = _pad_to(inputs[key], h)
        out = serve(*[tf.constant(inputs[n]) for n in names])[export.PROBABILITY]
        pieces.append(out.numpy().reshape(-1))
    if not pieces:
        raise PredictError(f"{spec.origin}: split {mapping!r} has no rows")
    return np.concatenate(pieces).astype(np.float32)


def write_probabilities(path: str, probabilities: np.ndarray, overwrite: bool = False) -> None:
    """Write ``probabilities`` to ``path`` (format by extension) atomically; refuse an existing file unless
    ``overwrite``."""
    from recsys_common.io import write_predictions
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
    """The command line's exit status (recsys_common.cli): 1 with one ``error: <class>: ...`` line."""
    from recsys_common.cli import exit_status
    return exit_status(main, argv, prog="predict", failures=(ValueError, OSError), with_type=True,
                       report=lambda r: print(f"predict: {r['rows']} probabilities written to {r['output']}"))


if __name__ == "__main__":
    sys.exit(cli())
