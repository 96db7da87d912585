"""A raw click log (CSV / TSV / parquet with a header) -> the split-binary dataset DLRM/DCNv2 train on: the shared
``recsys_common.prepare_clicks`` (one copy for both DLRM recipes; see it for the semantics and the ``apply`` step).

    python -m dlrm_dcnv2.dataloading.prepare_clicks --input train.csv --output /data/clicks --label click \
        --categorical site_id app_id device_model --numerical C15 C16
    python dlrm.py --dataset_path /data/clicks

``main(argv)`` returns ``{"spec": FeatureSpec, "report": dict}``.
"""
from __future__ import annotations

from typing import NoReturn

from recsys_common.cli import run_main
from recsys_common.prepare_clicks import (INPUT_ERRORS, ClickEncoder, ClickLogError, apply, build_parser,  # noqa: F401
                                          main, prepare)


def command() -> NoReturn:
    """The command line (exit 2 for bad input)."""
    run_main(main, input_errors=INPUT_ERRORS)


if __name__ == "__main__":
    command()
