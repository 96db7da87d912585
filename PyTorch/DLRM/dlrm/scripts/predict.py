"""Score a user's rows with a trained checkpoint, without a server: click probabilities written atomically.

    python -m dlrm.scripts.predict --load_checkpoint_path /tmp/dlrm_quickstart/checkpoint \
        --dataset /tmp/dlrm_quickstart/data --mapping test --output /tmp/dlrm_predictions.csv

The rows are mapping ``--mapping`` of the FeatureSpec ``--dataset/--feature_spec``: split-binary, headerless CSV or
parquet files, as training reads them (``recsys_common.datasets``). The FeatureSpec needs the channels
``numerical`` and ``categorical`` in the checkpoint's order and sizes; a ``label`` is optional (when the mapping has
it, the AUC, log loss, normalized entropy and calibration of the predictions are printed too). The model is the
checkpoint's eager DLRM in float32 (:func:`dlrm.serving.load_model`; any embedding type, any number of training
processes).

Output (``--output``): ``.csv`` with a header ``probability`` and one line per input row, in input order, or
``.npy`` (float32 ``[rows]``). It is written to a temporary name and renamed, so it is complete or absent; an
existing file is replaced only with ``--overwrite``. A bad row stops the run before anything is written, naming the
file, feature and row: an id below 0 or at or above its table's size (unless the model was trained with
``--hash_indices``), a NaN or infinite numerical value, a CSV value its feature's dtype cannot hold.

Prints (and returns from :func:`main`) a JSON summary: rows, output path, checkpoint; AUC, ``log_loss``,
``normalized_entropy`` and ``calibration`` when labels exist.
"""
from __future__ import annotations

import argparse
import json
import os
import re
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from recsys_common.checkpoints import CheckpointError
from recsys_common.cli import InputError, run_main
from recsys_common.datasets import DatasetError, open_reader
from recsys_common.feature_spec import FeatureSpec, FeatureSpecError
from recsys_common.io import add_prediction_flags, write_predictions
from recsys_common.metrics import roc_auc_score


class PredictError(InputError):
    """Input that cannot be scored; the message names the file / feature / row or the flag."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dlrm.scripts.predict",
                                description="Click probabilities for a user's rows from a DLRM checkpoint")
    p.add_argument("--load_checkpoint_path", required=True,
                   help="checkpoint written by dlrm.scripts.main (a step_<N> directory or its --save_checkpoint_path)")
    p.add_argument("--dataset", required=True, help="directory of the FeatureSpec describing the rows to score")
    p.add_argument("--feature_spec", default="feature_spec.yaml", help="FeatureSpec file name in --dataset")
    p.add_argument("--mapping", default="test", help="source_spec mapping (split) holding the rows")
    add_prediction_flags(p, (".csv", ".npy"))
    return p


def _check_rows(numerical: np.ndarray, categorical: np.ndarray, first_row: int, numerical_names: List[str],
                categorical_names: List[str], table_sizes: Optional[List[int]], where: str) -> None:
    """Raise :class:`PredictError` naming the feature and row of the first non-finite numerical value or id outside
    its table (``table_sizes`` None: any id is valid, ``--hash_indices``)."""
    bad = ~np.isfinite(numerical)
    if bad.any():
        row, col = map(int, np.argwhere(bad)[0])
        raise PredictError(f"{where}: feature {numerical_names[col]!r} row {first_row + row} is "
                           f"{numerical[row, col]} (numerical values must be finite)")
    if table_sizes is None:
        return
    bad = (categorical < 0) | (categorical >= np.asarray(table_sizes, dtype=np.int64))
    if bad.any():
        row, col = map(int, np.argwhere(bad)[0])
        raise PredictError(f"{where}: feature {categorical_names[col]!r} row {first_row + row} has id "
                           f"{categorical[row, col]} outside [0, {table_sizes[col]}) (the checkpoint's table "
                           f"{col} has {table_sizes[col]} rows)")


def _locate_bad_csv_value(spec, mapping: str) -> None:
    """Raise :class:`PredictError` naming file, feature, row and value of the first CSV value that its feature's
    dtype cannot hold (pyarrow's conversion error names only the column)."""
    import pyarrow as pa   # only to find a bad CSV value (recsys_common.datasets imports pyarrow late too)
    import pyarrow.csv as pacsv
    integer = re.compile(r"^\s*[-+]?\d+\s*$")
    for chunk in spec.source_spec.get(mapping, []):
        if chunk.get("type") != "csv":
            continue
        features = list(chunk["features"])
        for relative in chunk["files"]:
            path = spec.resolve_file(relative)
            table = pacsv.read_csv(path, read_options=pacsv.ReadOptions(column_names=features),
                                   convert_options=pacsv.ConvertOptions(
                                       column_types={f: pa.string() for f in features}))
            for name in features:
                is_int = np.issubdtype(spec.numpy_dtype(name), np.integer)
                for row, value in enumerate(table.column(name).to_pylist()):
                    if value is None:
                        continue
                    if is_int:
                        ok = bool(integer.match(value))
                    else:
                        try:
                            float(value)
                            ok = True
                        except ValueError:
                            ok = False
                    if not ok:
                        raise PredictError(f"{path}: feature {name!r} row {row} has value {value!r}, which is not "
                                           f"{'an integer' if is_int else 'a number'} "
                                           f"({spec.numpy_dtype(name)})")


def check_output(output: str, overwrite: bool, batch_size: int) -> None:
    """Refuse, before any work, what ``predict`` and the served ``deployment.client`` cannot write: a batch size below
    1, an ``--output`` that is not ``.csv`` / ``.npy``, an existing one without ``--overwrite``, a missing directory.
    Raises :class:`PredictError` naming the flag."""
    if batch_size < 1:
        raise PredictError(f"--batch_size must be >= 1, got {batch_size}")
    if not (output.endswith(".csv") or output.endswith(".npy")):
        raise PredictError(f"--output {output}: name a .csv or .npy file")
    if os.path.exists(output) and not overwrite:
        raise PredictError(f"--output {output} exists; pass --overwrite to replace it")
    if not os.path.isdir(os.path.dirname(os.path.abspath(output))):
        raise PredictError(f"--output {output}: directory {os.path.dirname(os.path.abspath(output))} does not exist")


def predict(load_checkpoint_path: str, dataset: str, output: str, feature_spec: str = "feature_spec.yaml",
            mapping: str = "test", batch_size: int = 65536, overwrite: bool = False) -> Dict[str, Any]:
    """Score mapping ``mapping`` of ``dataset``'s FeatureSpec with the checkpoint; write ``output``; return the
    summary. Raises :class:`PredictError` (and the checkpoint / FeatureSpec / dataset errors) naming what is wrong."""
    # torch (through the model), late: deployment/client.py takes PredictError and check_output from this module
    # on machines that only talk to a server
    from dlrm import serving
    from dlrm.utils.metrics import ClickMetrics
    check_output(output, overwrite, batch_size)
    spec_path = feature_spec if os.path.isabs(feature_spec) else os.path.join(dataset, feature_spec)
    spec = FeatureSpec.from_yaml(spec_path)
    channels = spec.channel_spec
    for channel in ("numerical", "categorical"):
        if channel not in channels:
            raise PredictError(f"{spec_path}: no {channel!r} channel (has {sorted(channels)})")
    if mapping not in spec.source_spec:
        raise PredictError(f"{spec_path}: no mapping {mapping!r} (has {sorted(spec.source_spec)}); choose with "
                           f"--mapping")
    numerical_names, categorical_names = list(channels["numerical"]), list(channels["categorical"])
    model, config, path = serving.load_model(load_checkpoint_path, num_numerical_features=len(numerical_names))
    if len(categorical_names) != len(config.table_sizes):
        raise PredictError(f"{spec_path}: {len(categorical_names)} categorical features, the checkpoint {path} "
                           f"has {len(config.table_sizes)} embedding tables")
    stored = set(spec.features_of_mapping(mapping))
    label = channels.get("label") or []
    with_label = bool(label) and all(f in stored for f in label)
    wanted = ["numerical", "categorical"] + (["label"] if with_label else [])
    # The reader checks ids against the FeatureSpec's cardinalities (naming file, feature, row); the model's table
    # sizes are checked below, as a user's FeatureSpec may declare other cardinalities than the training data's.
    reader = open_reader(spec, mapping, batch_size, channels=wanted)
    module = serving.serving_module(model)
    table_sizes = None if config.hash_indices else list(config.table_sizes)
    parts, labels = [], []
    for index in range(reader.num_batches_total):
        try:
            batch = reader.read_batch(index)
        except DatasetError as err:
            if "CSV" in str(err):  # pyarrow names the column only: find the row
                _locate_bad_csv_value(spec, mapping)
            raise
        numerical = np.asarray(batch["numerical"], np.float32)
        categorical = np.asarray(batch["categorical"], np.int64)
        _check_rows(numerical, categorical, index * batch_size, numerical_names, categorical_names, table_sizes,
                    f"{spec_path} mapping {mapping!r}")
        parts.append(serving.predict_probabilities(module, numerical, categorical, batch_size))
        if with_label:
            labels.append(np.asarray(batch["label"], np.float64).reshape(-1))
    probabilities = np.concatenate(parts) if parts else np.zeros(0, np.float32)
    write_predictions(output, probabilities)
    summary: Dict[str, Any] = {"rows": int(len(probabilities)), "output": os.path.abspath(output),
                               "checkpoint": path, "mean_probability": float(probabilities.mean())
                               if len(probabilities) else None}
    if with_label and len(probabilities):
        summary["auc"] = roc_auc_score(np.concatenate(labels), probabilities.astype(np.float64))
        click = ClickMetrics()
        click.add(np.concatenate(labels), probabilities=probabilities)
        summary.update(click.metrics())   # log_loss, normalized_entropy, calibration
    return summary


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Entry point for tests: ``main([...flags])`` returns the summary (raises on bad input)."""
    args = build_parser().parse_args(argv)
    return predict(args.load_checkpoint_path, args.dataset, args.output, args.feature_spec, args.mapping,
                   args.batch_size, args.overwrite)


if __name__ == "__main__":
    run_main(main, prog="dlrm.scripts.predict", input_errors=(PredictError, CheckpointError, DatasetError,
                                                             FeatureSpecError, ValueError, FileExistsError),
             failures=(OSError,), report=lambda summary: print(json.dumps(summary, indent=1)))
