"""Write a synthetic Criteo-shaped dataset (split binary + feature_spec.yaml) to train on without Criteo.

    python -m dlrm.scripts.prepare_synthetic_dataset --synthetic_dataset_dir /tmp/dlrm_synthetic_data \\
        --synthetic_dataset_num_entries 1048576 --synthetic_dataset_table_sizes 100000,100000,...

A thin wrapper over ``recsys_common.dataset_tools`` (shared with TensorFlow2/DLRM_DCNv2): power-law ids, labels from
a hidden logistic model, so a trained DLRM reaches an AUC well above 0.5 on the test mapping. Flags as NVIDIA's
script.
"""
from __future__ import annotations

import argparse
from typing import Optional, Sequence

from recsys_common.cli import run_main
from recsys_common.dataset_tools import INPUT_ERRORS, prepare_synthetic_parser, prepare_synthetic_main

TOOL = "dlrm.scripts.prepare_synthetic_dataset"


def build_parser() -> argparse.ArgumentParser:
    return prepare_synthetic_parser(TOOL, __doc__)


def main(argv: Optional[Sequence[str]] = None):
    return prepare_synthetic_main(argv, TOOL, __doc__)


if __name__ == "__main__":
    run_main(main, input_errors=INPUT_ERRORS)
