"""Generate headerless CSV files for a FeatureSpec whose chunks are CSV (step 1 of bring-your-own data).

    python gen_csv.py --feature_spec_in tests/feature_specs/fspec_csv.yaml --output /tmp/wd_csv --size 1000
    python transcode.py --input /tmp/wd_csv --output /tmp/wd_data                 # -> parquet + feature_spec.yaml
    python gen_embedding_sizes.py --feature_spec_in /tmp/wd_data/feature_spec.yaml --output /tmp/wd_data/emb.json

NVIDIA's flags (``--feature_spec_in --output --size``); the implementation is
``recsys_common.dataset_tools.generate_csv`` (shared with the DLRM recipes). ``--size`` rows go to the ``train``
mapping, ``--size // 10`` (at least 1) to every other one (``test`` here).
"""
from __future__ import annotations

from typing import Optional, Sequence

from recsys_common.cli import run_main
from recsys_common.dataset_tools import INPUT_ERRORS, gen_csv_main

TOOL = "gen_csv"


def main(argv: Optional[Sequence[str]] = None):
    """Writes the CSV dataset under ``--output``; returns its FeatureSpec."""
    return gen_csv_main(argv, TOOL, __doc__)


if __name__ == "__main__":
    run_main(main, input_errors=INPUT_ERRORS)
