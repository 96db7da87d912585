"""Convert a dataset into ``split_tfrecords``, the multi-hot capable input.

Command line: ``python -m dlrm_dcnv2.dataloading.transcribe``.

Sources (``--src_dataset_type``): ``tf_raw`` (split-binary), ``parquet`` / ``csv`` (a FeatureSpec with parquet or csv
chunks; parquet list columns are multi-hot features, ``max_hotness`` in the spec), ``synthetic`` (the
``--synthetic_dataset_*`` flags) and ``split_tfrecords`` (re-prebatch). Flags follow NVIDIA's ``transcribe.py``
(``--src_batch_size``, ``--dst_prebatch_size``, ``--max_batches_train/test``, ``--train_only``); NVIDIA's
``binary_multihot``, ``tfrecords_multihot`` and ``nvt`` sources are not offered (write parquet with list columns, e.g.
with NVTabular, and use ``parquet``).

The source is read through the same pipelines training uses, so its checks (ids in range, finite numericals)
apply on the way; the output is written through ``recsys_common.io.atomic_directory``: a non-empty destination is
refused unless ``--overwrite`` (which replaces only this tool's earlier output there), and ``feature_spec.yaml``
appears last, so a directory holding it is complete.

    python -m dlrm_dcnv2.dataloading.transcribe --src_dataset_type synthetic --synthetic_dataset_hotness 26x3 \\
        --synthetic_dataset_train_batches 8 --synthetic_dataset_valid_batches 2 --src_batch_size 4096 \\
        --dst_dataset_path /data/multihot --dst_prebatch_size 4096
"""
from __future__ import annotations

import argparse
import logging
import os
import time
from typing import Iterable, List, NoReturn, Optional

from recsys_common.cli import run_main
from recsys_common.io import atomic_directory

from .dataloader import DataError, create_input, load_spec
from .split_tfrecords_dataset import SplitWriter, tfrecords_spec

TOOL = "dlrm_dcnv2.dataloading.transcribe"
SRC_TYPES = ("tf_raw", "parquet", "csv", "synthetic", "split_tfrecords")


def parse_int_list(text: str) -> List[int]:
    """NVIDIA's list syntax: ``26x1000`` or ``1000,500,20`` (mixable: ``2x10,5``)."""
    out: List[int] = []
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        if "x" in part:
            count, value = part.split("x", 1)
            out += [int(value)] * int(count)
        else:
            out.append(int(part))
    return out


def add_synthetic_flags(p: argparse.ArgumentParser) -> None:
    """NVIDIA's ``--synthetic_dataset_*`` flags of a synthetic source (this tool and ``benchmarks/dataloader.py``)."""
    p.add_argument("--synthetic_dataset_train_batches", type=int, default=64008)
    p.add_argument("--synthetic_dataset_valid_batches", type=int, default=1350)
    p.add_argument("--synthetic_dataset_cardinalities", type=parse_int_list, default="26x1000")
    p.add_argument("--synthetic_dataset_hotness", type=parse_int_list, default="26x20")
    p.add_argument("--synthetic_dataset_num_numerical_features", type=int, default=13)
    p.add_argument("--synthetic_dataset_use_feature_spec", action="store_true")


def synthetic_options(args: argparse.Namespace) -> dict:
    """The flags of :func:`add_synthetic_flags` as ``create_input``'s ``synthetic_*`` keyword arguments."""
    return dict(synthetic_train_batches=args.synthetic_dataset_train_batches,
                synthetic_valid_batches=args.synthetic_dataset_valid_batches,
                synthetic_cardinalities=args.synthetic_dataset_cardinalities,   # argparse parses defaults
                synthetic_hotness=args.synthetic_dataset_hotness,
                synthetic_num_numerical=args.synthetic_dataset_num_numerical_features,
                synthetic_use_feature_spec=args.synthetic_dataset_use_feature_spec)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dlrm_dcnv2.dataloading.transcribe", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--src_dataset_type", choices=SRC_TYPES, default="tf_raw")
    p.add_argument("--src_dataset_path", default=None, help="source dataset directory (not for synthetic)")
    p.add_argument("--src_feature_spec", default="feature_spec.yaml", help="spec file name, relative to the source")
    p.add_argument("--src_batch_size", type=int, default=65536, help="rows read per step from the source")
    p.add_argument("--dst_dataset_path", required=True, help="output directory")
    p.add_argument("--dst_prebatch_size", type=int, default=65536, help="rows per TFRecord record")
    p.add_argument("--dst_dataset_type", choices=["split_tfrecords"], default="split_tfrecords")
    p.add_argument("--records_per_file", type=int, default=64, help="records per data_<k>.tfrecords file")
    p.add_argument("--max_batches_train", type=int, default=-1, help="source batches of train to convert (-1: all)")
    p.add_argument("--max_batches_test", type=int, default=-1, help="source batches of test to convert (-1: all)")
    p.add_argument("--train_only", action="store_true", help="convert the train split only")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty destination, replacing this tool's earlier output there")
    add_synthetic_flags(p)
    p.add_argument("--seed", type=int, default=12345, help="seed of the synthetic source")
    return p


def transcribe(src_dataset_type: str, src_dataset_path: Optional[str], dst_dataset_path: str,
               src_feature_spec: str = "feature_spec.yaml", src_batch_size: int = 65536,
               dst_prebatch_size: int = 65536, records_per_file: int = 64, max_batches_train: int = -1,
               max_batches_test: int = -1, train_only: bool = False, overwrite: bool = False,
               synthetic: Optional[dict] = None, seed: int = 12345) -> dict:
    """Convert; returns ``{"rows": {split: rows}, "spec": path}``. ``synthetic``: create_input's synthetic_* args."""
    kind = "tf_raw" if src_dataset_type in ("parquet", "csv") else src_dataset_type
    splits = {"train": max_batches_train} if train_only else {"train": max_batches_train, "test": max_batches_test}
    src_spec = None   # parsed once for every split
    if kind != "synthetic" or (synthetic or {}).get("synthetic_use_feature_spec"):
        src_spec = load_spec(src_dataset_path, src_feature_spec, "--src_feature_spec")
    sources = {m: create_input(kind, src_dataset_path, src_feature_spec, mapping=m, global_batch_size=src_batch_size,
                               seed=seed, prefetch=0, spec=src_spec, **(synthetic or {})) for m in splits}
    metadata = sources["train"].metadata
    spec = tfrecords_spec(metadata, list(splits))
    rows = {}
    with atomic_directory(dst_dataset_path, overwrite=overwrite, tool=TOOL, marker="feature_spec.yaml") as staging:
        for mapping, limit in splits.items():
            src = sources[mapping]
            if src.metadata.table_sizes != metadata.table_sizes or src.metadata.hotness != metadata.hotness:
                raise DataError(f"{src.name}: tables {src.metadata.table_sizes} / hotness {src.metadata.hotness} "
                                f"differ from the train split's")
            count = len(src) if limit < 0 else min(limit, len(src))
            writer = SplitWriter(spec, staging, mapping, dst_prebatch_size, records_per_file)
            for i in range(count):
                writer.write(*src.numpy_batch(i))
            rows[mapping] = writer.close()
        spec.base_directory = staging
        spec.to_yaml(os.path.join(staging, "feature_spec.yaml"))
    return {"rows": rows, "spec": os.path.join(os.path.abspath(dst_dataset_path), "feature_spec.yaml")}


def main(argv: Optional[Iterable[str]] = None) -> dict:
    args = build_parser().parse_args(None if argv is None else list(argv))
    if args.src_dataset_type != "synthetic" and not args.src_dataset_path:
        raise ValueError(f"--src_dataset_type {args.src_dataset_type} needs --src_dataset_path")
    synthetic = None
    if args.src_dataset_type == "synthetic":
        synthetic = synthetic_options(args)
    start = time.perf_counter()
    result = transcribe(args.src_dataset_type, args.src_dataset_path, args.dst_dataset_path,
                        src_feature_spec=args.src_feature_spec, src_batch_size=args.src_batch_size,
                        dst_prebatch_size=args.dst_prebatch_size, records_per_file=args.records_per_file,
                        max_batches_train=args.max_batches_train, max_batches_test=args.max_batches_test,
                        train_only=args.train_only, overwrite=args.overwrite, synthetic=synthetic, seed=args.seed)
    elapsed = time.perf_counter() - start
    listing = ", ".join(f"{m}: {n} rows" for m, n in result["rows"].items())
    print(f"wrote {args.dst_dataset_path} (split_tfrecords, prebatch {args.dst_prebatch_size}): {listing} "
          f"in {elapsed:.1f} s")
    return result


def command() -> NoReturn:
    """The command line: exit 2 for bad input (DataError is a ValueError), 1 for an I/O failure."""
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    run_main(main, input_errors=(ValueError, FileExistsError), failures=(OSError,))


if __name__ == "__main__":
    command()
