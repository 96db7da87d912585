"""Convert headerless CSV files described by a FeatureSpec into the split-binary dataset DLRM trains on.

    python -m dlrm.scripts.transcode --input /tmp/csv --output /data/binary [--feature_spec_in feature_spec.yaml]

``cardinality: auto`` in the input spec becomes ``max(id) + 1``; the completed spec is written as
``--feature_spec_out`` in ``--output``. A thin wrapper over ``recsys_common.transcode``. Flags as NVIDIA's script.
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from recsys_common import transcode
from recsys_common.cli import run_main


def _with_format(argv: Optional[Sequence[str]]) -> list:
    args = list(argv) if argv is not None else sys.argv[1:]
    if "--format" not in args:
        args += ["--format", "split_binary"]  # DLRM reads split binary
    return args


def main(argv: Optional[Sequence[str]] = None):
    return transcode.main(_with_format(argv))


if __name__ == "__main__":
    run_main(main, input_errors=transcode.INPUT_ERRORS)
