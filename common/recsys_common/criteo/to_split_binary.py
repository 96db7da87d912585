"""Parquet splits of the Spark job -> NVIDIA's split-binary dataset, streamed in blocks (pyarrow only).

    python -m recsys_common.criteo.to_split_binary --input /data/dlrm/spark/output --output /data/dlrm/binary_dataset

Reads ``INPUT/{train,test,validation}/part-*.parquet`` (in file-name order, which is row order) and
``INPUT/cardinalities.json``, and writes (reference B.2)::

    OUTPUT/feature_spec.yaml                     FeatureSpec.get_default_feature_spec(13, cardinalities)
    OUTPUT/<split>/label.bin                     bool, 1 byte per row
    OUTPUT/<split>/numerical.bin                 float16, 13 per row, row-major
    OUTPUT/<split>/cat_<i>.bin                   int8/int16/int32, the smallest that holds cardinality i
    OUTPUT/dictionaries/<i>.parquet, criteo.json  the Spark job's dictionaries (``INPUT/models``) in the layout the
                                                 single-machine engine saves them (``dictionaries.save_dictionary``)

through ``recsys_common.datasets.DatasetWriter`` (files renamed into place only when complete) and
``recsys_common.io.atomic_directory`` (a non-empty ``--output`` is refused unless ``--overwrite``, which replaces only
this tool's earlier outputs; ``feature_spec.yaml`` is moved in last). Only ``--block_rows`` rows are in memory at a time. The spec has
the mappings ``train``, ``test`` and ``validation``; DLRM trains on ``train`` and evaluates on ``test``.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import time
from typing import Dict, List, Optional, Sequence

import numpy as np

from recsys_common.cli import InputError
from . import CATEGORICAL_COLUMNS, LABEL_COLUMN, NUM_CATEGORICAL, NUM_NUMERICAL, NUMERICAL_COLUMNS, SPLITS
from ..datasets import DatasetWriter
from ..feature_spec import FeatureSpec
from ..io import atomic_directory
from ..logger import Progress


class ConversionError(InputError):
    """The Spark output is incomplete or not what this converter expects (names the file)."""


def parquet_files(directory: str) -> List[str]:
    files = sorted(glob.glob(os.path.join(directory, "*.parquet")))
    if not files and not os.path.isdir(directory):
        raise ConversionError(f"{directory}: split directory not found (run spark_preprocess first)")
    return files


def read_cardinalities(input_dir: str) -> List[int]:
    path = os.path.join(input_dir, "cardinalities.json")
    try:
        with open(path, encoding="utf-8") as f:
            cardinalities = json.load(f)
    except FileNotFoundError:
        raise ConversionError(f"{path}: not found; is {input_dir} the output of spark_preprocess?") from None
    if (not isinstance(cardinalities, list) or len(cardinalities) != NUM_CATEGORICAL
            or not all(isinstance(c, int) and c >= 1 for c in cardinalities)):
        raise ConversionError(f"{path}: expected a list of {NUM_CATEGORICAL} positive integers, got {cardinalities!r}")
    return cardinalities


def iter_blocks(files: Sequence[str], block_rows: int):
    """Yield dicts ``column -> numpy array`` of at most ``block_rows`` rows, in file then row order."""
    import pyarrow.parquet as pq
    columns = [LABEL_COLUMN] + NUMERICAL_COLUMNS + CATEGORICAL_COLUMNS
    for path in files:
        parquet = pq.ParquetFile(path)
        missing = [c for c in columns if c not in parquet.schema_arrow.names]
        if missing:
            raise ConversionError(f"{path}: missing column(s) {missing}")
        for batch in parquet.iter_batches(batch_size=block_rows, columns=columns):
            block = {}
            for name in columns:
                column = batch.column(batch.schema.get_field_index(name))
                if column.null_count:
                    raise ConversionError(f"{path}: column {name} has {column.null_count} null value(s)")
                block[name] = _as_numpy(column)
            yield block


def _as_numpy(column) -> np.ndarray:
    """A null-free pyarrow array of a fixed-width number type as a numpy view of its data buffer.

    ``Array.to_numpy`` imports pandas on first use (about half a second on a 2-core machine, for a job of a few
    seconds); the Spark job writes byte / float / int columns, which are read here without it.
    """
    import pyarrow as pa
    dtype = _NUMPY_TYPES.get(str(column.type))
    if dtype is None or pa.types.is_boolean(column.type):
        return column.to_numpy(zero_copy_only=False)
    return np.frombuffer(column.buffers()[1], dtype=dtype, count=len(column), offset=column.offset * dtype.itemsize)


_NUMPY_TYPES = {name: np.dtype(name.replace("float", "float32").replace("double", "float64"))
                for name in ("int8", "int16", "int32", "int64", "float", "double")}


def parquet_rows(files: Sequence[str]) -> int:
    """Rows of the parquet ``files``, from their footers (nothing else is read)."""
    import pyarrow.parquet as pq
    return sum(pq.ParquetFile(path).metadata.num_rows for path in files)


def convert_split(spec: FeatureSpec, split: str, files: Sequence[str], block_rows: int,
                  progress: Optional[Progress] = None) -> int:
    """Write ``split`` of ``spec`` from the parquet ``files``; returns its rows. ``progress`` counts the rows."""
    rows = 0
    with DatasetWriter(spec, split) as writer:
        for block in iter_blocks(files, block_rows):
            out: Dict[str, np.ndarray] = {"label": block[LABEL_COLUMN].astype(bool)}
            for i, name in enumerate(NUMERICAL_COLUMNS):
                out[f"num_{i}"] = block[name]
            for i, name in enumerate(CATEGORICAL_COLUMNS):
                out[f"cat_{i}.bin"] = block[name]
            writer.write(out)
            rows += len(out["label"])
            if progress is not None:
                progress.update(len(out["label"]))
    return rows


def dataset_metadata(report: dict, rows: Dict[str, int]) -> dict:
    """``feature_spec.yaml``'s metadata from a preprocessing report; shared with the single-machine engine
    (``polars_preprocess``) so that both write the same bytes."""
    return {
        "dataset": f"criteo-{report.get('input', {}).get('kind', 'unknown')}",
        "frequency_limit": report.get("frequency_limit"),
        "dictionary_source": report.get("dictionary_source"),
        "numerical_transform": "log(x + 3); missing or x <= -3 -> 0",
        "categorical_ids": "0 missing, 1 rare or unseen, 2.. frequent values by decreasing count",
        "num_samples": rows,
        "rows_malformed_excluded": {s: sum(v.values()) for s, v in report.get("rows_malformed", {}).items()},
    }


def copy_dictionaries(input_dir: str, output_dir: str, report: dict) -> bool:
    """``INPUT/models`` (the Spark job's ``column, value, count, id``) -> ``OUTPUT/dictionaries/<i>.parquet`` and
    ``criteo.json``, the content and layout ``polars_preprocess`` saves, one column in memory at a time. Returns
    False (nothing written) for a Spark output without dictionaries (one written before the job kept them)."""
    import polars as pl
    from .dictionaries import DICTIONARY_DIRECTORY, save_criteo_rule, save_dictionary
    files = sorted(glob.glob(os.path.join(input_dir, "models", "*.parquet")))
    if not files or "frequency_limit" not in report:
        return False
    target = os.path.join(output_dir, DICTIONARY_DIRECTORY)
    os.makedirs(target)
    scan = pl.scan_parquet(files)
    for i in range(NUM_CATEGORICAL):
        dictionary = scan.filter(pl.col("column") == i).select("value", "count", "id").collect()
        save_dictionary(dictionary, os.path.join(target, f"{i}.parquet"))
    save_criteo_rule(target, report["frequency_limit"], report["dictionary_source"])
    return True


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m recsys_common.criteo.to_split_binary",
                                     description="Spark parquet output -> split-binary dataset with feature_spec.yaml",
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--input", required=True, help="output directory of spark_preprocess")
    parser.add_argument("--output", required=True,
                        help="split-binary dataset directory: new or empty unless --overwrite (other files are kept)")
    parser.add_argument("--splits", nargs="+", default=list(SPLITS), choices=SPLITS, help="splits to convert")
    parser.add_argument("--block_rows", type=int, default=1 << 20, help="rows converted at a time")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into a non-empty --output, replacing this tool's own earlier outputs there (other "
                             "files, such as the Spark output, are kept; a name taken by another file is refused)")
    return parser


def main(argv: Optional[Sequence[str]] = None) -> FeatureSpec:
    """Convert; returns the written FeatureSpec (base_directory = --output)."""
    args = build_parser().parse_args(argv)
    started = time.time()
    cardinalities = read_cardinalities(args.input)
    files = {split: parquet_files(os.path.join(args.input, split)) for split in args.splits}
    report_path = os.path.join(args.input, "preprocess_report.json")
    report = {}
    if os.path.isfile(report_path):
        with open(report_path, encoding="utf-8") as f:
            report = json.load(f)
    rows = {}
    # feature_spec.yaml is the marker: removed first and written last, so a dataset directory that has one is whole.
    with atomic_directory(args.output, overwrite=args.overwrite, tool="recsys_common.criteo.to_split_binary",
                          marker="feature_spec.yaml") as tmp:
        spec = FeatureSpec.get_default_feature_spec(NUM_NUMERICAL, cardinalities, mappings=args.splits,
                                                    base_directory=tmp)
        for split in args.splits:
            # done of total rows, rate and time left every few seconds (the footers give the total)
            progress = Progress(f"[criteo] {split}", parquet_rows(files[split]))
            rows[split] = convert_split(spec, split, files[split], args.block_rows, progress)
            expected = report.get("rows_written", {}).get(split)
            if expected is not None and expected != rows[split]:
                raise ConversionError(f"{args.input}/{split}: {rows[split]} rows in parquet, but the Spark job's "
                                      f"report says {expected}")
            print(f"[criteo] {split}: {rows[split]} rows", flush=True)
        spec.metadata = dataset_metadata(report, rows)
        if not copy_dictionaries(args.input, tmp, report):
            print(f"[criteo] {args.input} has no dictionaries (models/ and preprocess_report.json): the dataset "
                  f"trains, but raw feature values cannot be mapped for serving", flush=True)
        spec.to_yaml(os.path.join(tmp, "feature_spec.yaml"))
    print(f"[criteo] wrote {args.output} in {time.time() - started:.1f} s", flush=True)
    return FeatureSpec.from_yaml(os.path.join(args.output, "feature_spec.yaml"))


if __name__ == "__main__":
    from recsys_common.cli import run_main
    run_main(main, input_errors=(ConversionError, FileExistsError))
