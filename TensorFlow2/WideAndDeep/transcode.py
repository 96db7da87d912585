"""Headerless CSV + a FeatureSpec -> the parquet files and completed ``feature_spec.yaml`` that ``main.py`` reads.

    python transcode.py --input /tmp/wd_csv --feature_spec_in feature_spec.yaml --output /tmp/wd_data

NVIDIA's flags (``--input --feature_spec_in --output --feature_spec_out --chunk_size --minimum_partition_number``)
over ``recsys_common.transcode`` with ``--format parquet``: ``cardinality: auto`` becomes ``max(value) + 1``, each
mapping is written as ``<mapping>/part_0.parquet`` and the spec appears last, over a complete set of files
(``recsys_common.io.atomic_directory``; a non-empty ``--output`` is refused unless ``--overwrite``, which replaces
only this tool's earlier outputs). Deliberate difference: ``--minimum_partition_number`` is accepted for NVIDIA's
command lines but each mapping is one file, so this output trains on one process (Horovod ranks need a file each).
"""
from __future__ import annotations

import argparse
from typing import Optional, Sequence

from recsys_common import transcode as common
from recsys_common.cli import run_main
from recsys_common.dataset_tools import INPUT_ERRORS


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python transcode.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", required=True, help="directory the input spec's CSV file paths are relative to")
    p.add_argument("--feature_spec_in", default="feature_spec.yaml",
                   help="input FeatureSpec YAML; a relative name is looked up in --input")
    p.add_argument("--output", default="/data", help="output dataset directory")
    p.add_argument("--feature_spec_out", default="feature_spec.yaml", help="name of the completed spec in --output")
    p.add_argument("--chunk_size", type=int, default=65536, help="rows written per block")
    p.add_argument("--minimum_partition_number", type=int, default=8,
                   help="accepted for NVIDIA's command lines; each mapping is written as one file")
    p.add_argument("--overwrite", action="store_true",
                   help="write into a non-empty --output, replacing this tool's own earlier outputs there")
    return p


def main(argv: Optional[Sequence[str]] = None):
    """Transcodes to parquet; returns the completed FeatureSpec (its ``origin`` is the written YAML)."""
    args = build_parser().parse_args(None if argv is None else list(argv))
    if args.chunk_size < 1:
        raise ValueError(f"--chunk_size must be >= 1, got {args.chunk_size}")
    forwarded = ["--input", args.input, "--feature_spec_in", args.feature_spec_in, "--output", args.output,
                 "--feature_spec_out", args.feature_spec_out, "--chunk_size", str(args.chunk_size),
                 "--format", "parquet"] + (["--overwrite"] if args.overwrite else [])
    return common.main(forwarded)


if __name__ == "__main__":
    run_main(main, input_errors=INPUT_ERRORS)
