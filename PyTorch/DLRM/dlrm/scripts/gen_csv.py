"""Generate headerless CSV files for a FeatureSpec whose chunks are CSV (the first step of bring-your-own data).

    python -m dlrm.scripts.gen_csv --feature_spec_in tests/transcoding/small_csv.yaml --output /tmp/csv --size 1000
    python -m dlrm.scripts.transcode --input /tmp/csv --output /tmp/binary      # -> split binary for training

A thin wrapper over ``recsys_common.dataset_tools`` (shared with TensorFlow2/DLRM_DCNv2; it writes each mapping in the
spec's own chunk types). ``--size`` rows go to the ``train`` mapping, ``--size // 10`` (at least 1) to every other
one. Flags as NVIDIA's script.
"""
from __future__ import annotations

import argparse
from typing import Optional, Sequence

from recsys_common.cli import run_main
from recsys_common.dataset_tools import INPUT_ERRORS, gen_csv_parser, gen_csv_main

TOOL = "dlrm.scripts.gen_csv"


def build_parser() -> argparse.ArgumentParser:
    return gen_csv_parser(TOOL, __doc__)


def main(argv: Optional[Sequence[str]] = None):
    return gen_csv_main(argv, TOOL, __doc__)


if __name__ == "__main__":
    run_main(main, input_errors=INPUT_ERRORS)
