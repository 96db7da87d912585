"""A raw click log (CSV / TSV / parquet with a header) -> the split-binary dataset DLRM/DCNv2 train on: the shared
``recsys_common.prepare_clicks`` (one copy for both DLRM recipes; see it for the semantics and the ``apply`` step).

    python -m dlrm_dcnv2.dataloading.prepare_clicks --input train.csv --output /data/clicks --label click \
        --categorical site_id app_id device_model --numerical C15 C16
    python dlrm.py --dataset_path /data/clicks

``main(argv)`` returns ``{"spec": FeatureSpec, "report": dict}``.
"""
from __future__ import annotations

import sys

from recsys_common.prepare_clicks import (ClickEncoder, ClickLogError, apply, build_parser, main,  # noqa: F401
                                          prepare, run_cli)

if __name__ == "__main__":
    run_cli(sys.argv[1:])
