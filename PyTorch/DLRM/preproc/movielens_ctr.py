#!/usr/bin/env python3
"""MovieLens-1M -> a click-through-rate dataset: the shared ``recsys_common.movielens_ctr`` (one copy for every recipe).

This recipe trains on the default layout (``--genres slots``: split-binary, genres as ``genre_0..genre_2``); the
shared module also writes the genres as one multi-hot feature (``--genres multi_hot``, parquet), which this recipe's
model (single-hot embeddings only) does not read. See ``recsys_common/movielens_ctr.py`` for the layout.

    python preproc/movielens_ctr.py --input_dir /data/ml-1m --output /data/ml-1m-ctr
"""
from __future__ import annotations

import sys
from typing import Optional, Sequence

from recsys_common.movielens_ctr import (AGE_BUCKETS, CATEGORICAL_FEATURES, GENRES, LABEL_FEATURE,  # noqa: F401
                                         NUMERICAL_FEATURES, SPLITS, MovieLensFormatError, build_columns,
                                         build_dataset, build_parser, find_ratings_file, make_feature_spec,
                                         parse_args, read_movies, read_ratings, read_users)
from recsys_common import movielens_ctr as _shared


def main(argv: Optional[Sequence[str]] = None):
    """Convert; returns the written FeatureSpec (base_directory = --output)."""
    return _shared.main(argv, tool="dlrm.preproc.movielens_ctr")


if __name__ == "__main__":
    main(sys.argv[1:])
