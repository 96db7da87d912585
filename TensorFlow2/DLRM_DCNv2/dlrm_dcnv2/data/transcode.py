"""Convert headerless CSV files described by a FeatureSpec into the split-binary dataset DLRM/DCNv2 train on.

    python -m dlrm_dcnv2.dataloading.transcode --input /tmp/csv --output /data/binary [--feature_spec_in spec.yaml]

``cardinality: auto`` in the input spec becomes ``max(id) + 1``; the completed spec is written as
``--feature_spec_out`` in ``--output``. NVIDIA's flags over ``recsys_common.transcode`` (split binary unless
``--format parquet``). Multi-hot ``split_tfrecords`` data comes from ``dlrm_dcnv2.dataloading.transcribe``.
"""
from __future__ import annotations

import sys
from typing import NoReturn, Optional, Sequence

from recsys_common import transcode
from recsys_common.cli import run_main


def _with_format(argv: Optional[Sequence[str]]) -> list:
    args = list(argv) if argv is not None else sys.argv[1:]
    if "--format" not in args and not any(a.startswith("--format=") for a in args):
        args += ["--format", "split_binary"]   # what --dataset_type tf_raw reads
    return args


def main(argv: Optional[Sequence[str]] = None):
    """Returns the completed FeatureSpec of the written dataset."""
    return transcode.main(_with_format(argv))


def command() -> NoReturn:
    """The command line (exit 2 for bad input)."""
    run_main(main, input_errors=transcode.INPUT_ERRORS)


if __name__ == "__main__":
    command()
