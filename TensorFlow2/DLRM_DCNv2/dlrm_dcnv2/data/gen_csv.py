"""Generate headerless CSV files for a FeatureSpec whose chunks are CSV (the first step of bring-your-own data).

    python -m dlrm_dcnv2.dataloading.gen_csv --feature_spec_in tests/transcoding/small_csv.yaml --output /tmp/csv
    python -m dlrm_dcnv2.dataloading.transcode --input /tmp/csv --output /tmp/binary    # -> split binary

NVIDIA's flags; the implementation is ``recsys_common.dataset_tools.generate_csv`` (shared with PyTorch/DLRM).
``--size`` rows go to the ``train`` mapping, ``--size // 10`` (at least 1) to every other one.
"""
from __future__ import annotations

from typing import NoReturn, Optional, Sequence

from recsys_common.cli import run_main
from recsys_common.dataset_tools import INPUT_ERRORS, gen_csv_main

TOOL = "dlrm_dcnv2.dataloading.gen_csv"


def main(argv: Optional[Sequence[str]] = None):
    """Returns the FeatureSpec of the written CSV dataset."""
    return gen_csv_main(argv, TOOL, __doc__)


def command() -> NoReturn:
    """The command line (exit 2 for bad input)."""
    run_main(main, input_errors=INPUT_ERRORS)


if __name__ == "__main__":
    command()
