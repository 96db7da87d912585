"""Criteo click logs (Terabyte ``day_0..day_23`` and Kaggle ``train.txt``) -> NVIDIA's split-binary dataset.

One implementation shared by PyTorch/DLRM and TensorFlow2/DLRM_DCNv2. Two steps, two entry points:

1. ``python -m recsys_common.criteo.spark_preprocess`` (PySpark): raw TSV -> dictionaries + parquet per split.
2. ``python -m recsys_common.criteo.to_split_binary`` (pyarrow only): parquet -> ``label.bin`` / ``numerical.bin`` /
   ``cat_<i>.bin`` + ``feature_spec.yaml``, streamed in blocks.

The semantics (documented in ``PyTorch/DLRM/preproc/README.md``):

- a raw row is ``label \\t I1..I13 \\t C1..C26``; an empty field is missing; a row with fewer than 40 fields (trailing
  empty fields stripped by some copies of the data) is padded with missing fields; public CSV copies (commas, a
  header line, integers written as ``260.0``) read the same;
- a row whose label is not ``0``/``1``, whose integer field is not an integral number, or that has more than 40
  fields is *malformed*: counted per reason, reported with file, line and text, and excluded (never shifted into
  other columns);
- numerical: ``log(x + 3)`` as NVIDIA's Spark job; missing (and ``x <= -3``, where the log is undefined) -> 0;
- categorical: per feature, values seen at least ``frequency_limit`` times get ids ``2, 3, ...`` by decreasing
  frequency (ties by value), id 0 = missing, id 1 = rare (seen fewer times) or unseen.

This package imports neither torch nor tensorflow; pyspark is imported only inside the Spark job's functions.
"""
from __future__ import annotations

NUM_NUMERICAL = 13
NUM_CATEGORICAL = 26
NUM_FIELDS = 1 + NUM_NUMERICAL + NUM_CATEGORICAL  # 40

MISSING_ID = 0
RARE_ID = 1
FIRST_FREQUENT_ID = 2

DEFAULT_FREQUENCY_LIMIT = 15

LABEL_COLUMN = "label"
NUMERICAL_COLUMNS = [f"num_{i}" for i in range(NUM_NUMERICAL)]
CATEGORICAL_COLUMNS = [f"cat_{i}" for i in range(NUM_CATEGORICAL)]
SPLITS = ("train", "test", "validation")

# Malformed-row reasons (the report counts them per split).
REASON_EMPTY_LINE = "empty_line"
REASON_TOO_MANY_FIELDS = "too_many_fields"
REASON_BAD_LABEL = "bad_label"
REASON_BAD_NUMERICAL = "bad_numerical_I{}"  # 1-based, as Criteo names the integer columns I1..I13
