"""Write a synthetic Criteo-shaped split-binary dataset (+ feature_spec.yaml) to train on without Criteo.

    python -m dlrm_dcnv2.dataloading.prepare_synthetic_dataset --synthetic_dataset_dir /tmp/dlrm_synthetic_data \\
        --synthetic_dataset_num_entries 1048576 --synthetic_dataset_table_sizes 100000,100000,...
    python dlrm.py --dataset_path /tmp/dlrm_synthetic_data --feature_spec feature_spec.yaml ...

Power-law ids and labels from a hidden logistic model, so a trained model reaches an AUC well above 0.5 on the test
mapping (unlike ``--dataset_type synthetic``, which generates random batches on the fly for speed runs). NVIDIA's
flags; the implementation is ``recsys_common.dataset_tools.prepare_synthetic_dataset`` (shared with PyTorch/DLRM).
``--feature_spec`` (e.g. written by ``generate_feature_spec --variant criteo_t15_synthetic``) sets the shape.
"""
from __future__ import annotations

from typing import NoReturn, Optional, Sequence

from recsys_common.cli import run_main
from recsys_common.dataset_tools import INPUT_ERRORS, prepare_synthetic_main

TOOL = "dlrm_dcnv2.dataloading.prepare_synthetic_dataset"


def main(argv: Optional[Sequence[str]] = None):
    """Returns the FeatureSpec of the written dataset."""
    return prepare_synthetic_main(argv, TOOL, __doc__)


def command() -> NoReturn:
    """The command line (exit 2 for bad input)."""
    run_main(main, input_errors=INPUT_ERRORS)


if __name__ == "__main__":
    command()
