#!/usr/bin/env python3
"""One-hot logistic regression floor: the shared ``recsys_common.logistic_baseline`` (one copy for every recipe).

    python preproc/logistic_baseline.py --dataset /data/ml-1m-ctr

``main(argv)`` returns the test AUC.
"""
from __future__ import annotations

import sys

from recsys_common.logistic_baseline import build_parser, load_mapping, main, parse_args  # noqa: F401

if __name__ == "__main__":
    main(sys.argv[1:])
