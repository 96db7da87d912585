"""Spark job: Criteo raw TSV -> frequency-limited dictionaries and parquet ``train`` / ``test`` / ``validation``.

    python -m recsys_common.criteo.spark_preprocess --input_path /data/dlrm/criteo --output_path /data/dlrm/spark/output

Runs on ``local[*]`` by default and on any cluster with ``--master`` (the input and output paths must then be on a
file system every executor and this driver see). The steps, each one pass over the raw data:

1. *Line index of the split file* (Terabyte ``day_23``, Kaggle ``train.txt``): count the lines of each input block, so
   every line gets its exact line number and the file can be cut into train / test / validation by line
   (``layout.split_boundaries``).
2. *Counts*: parse every row; count malformed rows per split and reason, padded rows, and the frequency of every
   categorical value (``--dictionary_source all``, as NVIDIA's "frequency in the whole dataset", or ``train``).
   Values seen at least ``--frequency_limit`` times get ids ``2, 3, ...`` by decreasing frequency: the dictionaries,
   written to ``OUTPUT/models`` (parquet: ``column, value, count, id``).
3. *Transform*: join every row with the dictionaries (0 = missing, 1 = rare or unseen), ``log(x + 3)`` the integer
   features (missing -> 0), and write ``OUTPUT/{train,test,validation}/part-*.parquet`` in line order. Part files
   sort by name in row order. With the dictionaries broadcast (the usual case) rows never leave the task that read
   them: no shuffle and no sort.
4. *Train shuffle* (``--train_ordering random``, the default): the train parquet files read back and written in a
   pseudo-random order fixed by ``--seed`` (``shuffle_train``); ``test`` and ``validation`` stay in line order.

Speed: every step is Spark SQL (no Python UDF, nothing collected to the driver but counts and the few malformed
examples). Spark fuses a stage's operators into one generated method; the parse plus 26 joins made one of 60 kB of
bytecode, over the JVM's 8 kB huge-method limit, so it was interpreted, never compiled (a JFR profile: two thirds of
the samples in that ``processNext``). The job now sets ``spark.sql.codegen.hugeMethodLimit`` to 8000 (a stage over it
runs operator by operator, each projection's code split into small compiled methods) and cuts the plan into stages
under it (``codegen_stage_boundary``: after the parse, every ``JOINS_PER_CODEGEN_STAGE`` joins); rows carry only the
output's columns through the joins, and plain integers skip the regular expressions. Measured 2026-11-25 (AMD EPYC,
2 vCPUs): warm, in one JVM under load 6-8, pass 3's work (parse + joins, no-op sink) 37-39 -> 16 CPU-s; one cold run
at 1M rows, idle, back to back: 45.3 -> 39.6 s end to end (pass 2 13.1 -> 11.6 s, pass 3 18.8 -> 15.4 s): JIT
warm-up of the many generated classes dominates at that size. Passes 2 and 3 each parse the text once; caching the
parsed rows between them was tried before the codegen change and saved nothing measurable on 2 cores.

Where a cold 1M-row run's time goes now (2026-11-25 13:30 UTC, AMD EPYC, 2 cores, Java Flight Recorder): the JIT
compilers spent 32 CPU-s on 24,000 compilations (the generated join stages' ``processNext`` 0.5-0.9 s each), about
as much as the executors' own work; the same job in a JVM that ran it twice before takes 20 s instead of 35 s. Of
the executors' samples: the parse's projections 25 %, the join stages 19 %, parquet writing 12 %, the counts'
hash aggregation 11 %, hash-join probes 6 %. Tried and not kept (no difference beyond noise, or slower): C1-only or
C2-only JIT, ``CompileThresholdScaling`` 5 and 20, a 3 GB heap or a larger young generation, parquet without
dictionary encoding, no two-level aggregation map, 64 MB input splits, adaptive execution off. Kept: ParallelGC for a
local driver (``spark_settings``) and a stage boundary inside the parse (``parse_rows``). End to end with the
split-binary conversion, idle, 2026-11-25 14:30-14:38 UTC: 27,120 rows/s at 1M generated rows, 46,994 at 4M,
58,509 at 8M (``PyTorch/DLRM/benchmarks/preprocess.py --engines spark``; the DLRM READMEs).

Outputs also ``OUTPUT/model_size.json`` (NVIDIA's: largest id per categorical column ``_c14 .. _c39``, so cardinality
= value + 1), ``OUTPUT/cardinalities.json`` and ``OUTPUT/preprocess_report.json`` (row counts per split, malformed
rows per reason with examples, padded rows, parameters). The outputs are written under a temporary name and moved in
when complete (``recsys_common.io.atomic_directory``: a non-empty output directory is refused unless ``--overwrite``,
which replaces only this job's earlier outputs; ``cardinalities.json`` comes last). Then
``python -m recsys_common.criteo.to_split_binary`` converts the parquet files.

Input text: fields separated by tabs (Criteo's files) or commas (public CSV copies), found per file from its first
line or set with ``--delimiter``; a first line of column names (``label,I1,...,C26``) is a header, skipped, found per
file (``--header auto``) or declared (``--header yes|no``). Fields are not quoted. An integer field may be written as
an integer (``260``) or as a float with an integral value (``260.0``, ``2.6e2``, as pandas writes integer columns
with missing values); the label too (``1.0``).

Rows with fewer than 40 fields are padded with missing fields (``padded`` in the report). Rows that cannot be parsed
(label not 0/1, an integer field that is not an integral number (``2.5``, ``abc``; exact rules in
``integral_value``), more than 40 fields, an empty line) are counted, reported with file and line, and excluded; the job fails
(non-zero exit, no output) when they exceed ``--max_malformed_fraction`` of the rows, which catches a wrong file or
separator instead of silently training on garbage.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from typing import Any, Dict, List, Optional, Sequence

from . import (CATEGORICAL_COLUMNS, DEFAULT_FREQUENCY_LIMIT, FIRST_FREQUENT_ID, LABEL_COLUMN, MISSING_ID,
               NUM_CATEGORICAL, NUM_FIELDS, NUM_NUMERICAL, NUMERICAL_COLUMNS, RARE_ID, REASON_BAD_LABEL,
               REASON_BAD_NUMERICAL, REASON_EMPTY_LINE, REASON_TOO_MANY_FIELDS, SPLITS)
from .layout import (DELIMITER_CHOICES, EXPONENT_RE, HEADER_CHOICES, INTEGER_RE, MAX_EXACT_DOUBLE_INTEGER,
                     MAX_INTEGER, MAX_MANTISSA_DIGITS, ZERO_FRACTION_RE, CriteoInputError, FileFormat,
                     InputLayout, discover_input, sniff_format, split_boundaries)
from .report import CriteoPreprocessError, check_malformed, malformed_total, rows_written
from ..io import atomic_directory, atomic_write_text, check_output_directory

_ROW_BITS = 33                      # monotonically_increasing_id(): partition index << 33 | row within partition
_ROW_MASK = (1 << _ROW_BITS) - 1
_MAX_EXAMPLE_CHARS = 300
JOINS_PER_CODEGEN_STAGE = 7          # joins fused into one generated method (see codegen_stage_boundary)
HUGE_METHOD_LIMIT = 8000             # HotSpot's: larger generated methods are never JIT-compiled
LOCAL_JVM_OPTIONS = "-XX:+UseParallelGC"   # the driver's JVM for a local master (see spark_settings)


# ----------------------------------------------------------------------------------------------------- arguments
def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="python -m recsys_common.criteo.spark_preprocess",
        description="Criteo raw TSV, or a CSV copy (Terabyte day_0..day_23 or Kaggle train.txt) -> dictionaries + "
                    "parquet splits.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--input_path", default=env("INPUT_PATH"), required=env("INPUT_PATH") is None,
                        help="directory with day_0 .. day_23 (Terabyte) or train.txt (Kaggle), or train.txt itself "
                             "[env INPUT_PATH]")
    parser.add_argument("--output_path", default=env("OUTPUT_PATH"), required=env("OUTPUT_PATH") is None,
                        help="output directory (models/, train/, test/, validation/, reports) [env OUTPUT_PATH]")
    parser.add_argument("--layout", choices=("auto", "terabyte", "kaggle"), default="auto",
                        help="input layout; auto: day_<N> files -> terabyte, else train.txt -> kaggle")
    parser.add_argument("--header", choices=HEADER_CHOICES, default="auto",
                        help="whether each input file starts with a line of column names, which is skipped; auto: "
                             "yes when the first line's label field is not a number and names columns "
                             "(label/Label/click or I1, C1, ...)")
    parser.add_argument("--delimiter", choices=DELIMITER_CHOICES, default="auto",
                        help="field separator of the input files; auto: per file, tab if its first line has a tab, "
                             "else comma if it has a comma")
    parser.add_argument("--frequency_limit", type=int,
                        default=int(env("FREQUENCY_LIMIT", DEFAULT_FREQUENCY_LIMIT)),
                        help="categorical values seen fewer times map to the rare id 1; 0 or 1 keeps every value "
                             "[env FREQUENCY_LIMIT]")
    parser.add_argument("--dictionary_source", choices=("all", "train"), default="all",
                        help="rows whose categorical values are counted for the dictionaries: all splits "
                             "(NVIDIA's choice) or train only (test values unseen in train then map to id 1)")
    parser.add_argument("--train_ordering", choices=("random", "input"), default="random",
                        help="row order of the train split: shuffled with --seed, or the input's order")
    parser.add_argument("--seed", type=int, default=12345, help="seed of the train shuffle")
    parser.add_argument("--max_malformed_fraction", type=float, default=0.01,
                        help="fail when more than this fraction of the rows is malformed")
    parser.add_argument("--max_examples", type=int, default=20, help="malformed rows quoted in the report")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into a non-empty --output_path, replacing this job's own earlier outputs there "
                             "(other files are kept; a name taken by another file is refused)")
    spark = parser.add_argument_group("Spark")
    spark.add_argument("--master", default=env("SPARK_MASTER", "local[*]"),
                       help="Spark master: local[*], local[N], spark://host:7077, yarn, k8s://... [env SPARK_MASTER]")
    spark.add_argument("--total_cores", type=int, default=int(env("TOTAL_CORES")) if env("TOTAL_CORES") else None,
                       help="cores to use: local[N] for a local master, spark.cores.max otherwise [env TOTAL_CORES]")
    spark.add_argument("--total_memory", type=int,
                       default=int(env("TOTAL_MEMORY")) if env("TOTAL_MEMORY") else None,
                       help="GiB of memory: the driver's for a local master, shared by the executors otherwise "
                            "[env TOTAL_MEMORY]")
    spark.add_argument("--executor_cores", type=int, default=5, help="cores per executor (non-local masters)")
    spark.add_argument("--spark_local_dirs", default=env("SPARK_LOCAL_DIRS"),
                       help="scratch directories for shuffle data, comma-separated [env SPARK_LOCAL_DIRS]")
    spark.add_argument("--shuffle_partitions", type=int, default=None,
                       help="spark.sql.shuffle.partitions (default: Spark's, coalesced by adaptive execution)")
    spark.add_argument("--broadcast_max_rows", type=int, default=1_000_000,
                       help="dictionaries with at most this many values are broadcast to the join; larger ones are "
                            "sort-merge joined")
    spark.add_argument("--spark_conf", action="append", default=[], metavar="KEY=VALUE",
                       help="extra Spark configuration, repeatable (e.g. the RAPIDS plugin for GPU Spark)")
    return parser


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.frequency_limit < 0:
        parser.error(f"--frequency_limit must be >= 0, got {args.frequency_limit}")
    if not 0.0 <= args.max_malformed_fraction <= 1.0:
        parser.error(f"--max_malformed_fraction must be in [0, 1], got {args.max_malformed_fraction}")
    for item in args.spark_conf:
        if "=" not in item:
            parser.error(f"--spark_conf expects KEY=VALUE, got {item!r}")
    return args


# ----------------------------------------------------------------------------------------------------- Spark session
def spark_settings(args: argparse.Namespace) -> Dict[str, str]:
    """The Spark configuration this job asks for (see README's memory/disk section for sizing)."""
    master = args.master
    conf: Dict[str, str] = {"spark.ui.showConsoleProgress": "false"}
    local = master.startswith("local")
    if local and args.total_cores and master in ("local", "local[*]"):
        master = f"local[{args.total_cores}]"
    if args.total_memory:
        if local:
            conf["spark.driver.memory"] = f"{args.total_memory}g"
        else:
            cores = args.total_cores or args.executor_cores
            executors = max(1, cores // args.executor_cores)
            conf["spark.executor.memory"] = f"{max(1, int(args.total_memory * 0.9 / executors))}g"
    if not local:
        conf["spark.executor.cores"] = str(args.executor_cores)
        if args.total_cores:
            conf["spark.cores.max"] = str(args.total_cores)
    if args.spark_local_dirs:
        conf["spark.local.dir"] = args.spark_local_dirs
    if args.shuffle_partitions:
        conf["spark.sql.shuffle.partitions"] = str(args.shuffle_partitions)
    if local:
        # The throughput collector: this is a batch job, and G1's concurrent work and write barriers cost more than
        # the pauses it avoids (measured 2026-11-25, AMD EPYC, 2 cores, 1M rows, cold: 44.5 s with G1, Java 17's
        # default, 35.8-39.3 s with ParallelGC; 1.5 s of pauses in all). On a cluster the executors keep theirs.
        conf["spark.driver.extraJavaOptions"] = LOCAL_JVM_OPTIONS
    for item in args.spark_conf:
        key, value = item.split("=", 1)
        conf[key.strip()] = value.strip()   # a user's value replaces the job's
    conf["spark.master"] = master
    return conf


def create_session(args: argparse.Namespace):
    from pyspark.sql import SparkSession
    if args.master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")   # otherwise Spark binds a non-loopback address
    conf = spark_settings(args)
    builder = SparkSession.builder.appName("criteo-preprocess")
    for key, value in conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


# ----------------------------------------------------------------------------------------------------- reading
def _read_file(spark, path: str, file_index: int, fmt: Optional[FileFormat] = None):
    """One raw file as rows ``value, _file, _block, _row, _sep``: ``_row`` is the row's index within its input block,
    ``_sep`` the file's field separator. With ``fmt.header`` the file's first line (block 0, row 0) is left out."""
    from pyspark.sql import functions as F
    fmt = fmt or FileFormat("\t", False)
    rows = spark.read.text(path).select(
        F.col("value"),
        F.lit(file_index).alias("_file"),
        F.input_file_block_start().alias("_block"),
        (F.monotonically_increasing_id().bitwiseAND(F.lit(_ROW_MASK))).alias("_row"),
        F.lit(fmt.delimiter).alias("_sep"))
    if fmt.header:
        rows = rows.where((F.col("_block") != 0) | (F.col("_row") != 0))
    return rows


def block_line_offsets(spark, path: str) -> Dict[int, int]:
    """Pass 1 for the split file: ``{block start byte: index of the block's first line}`` and the line count.

    In a scan of one file every partition reads exactly one block, so a row's number within its partition (the low
    bits of ``monotonically_increasing_id``) is its number within the block; the checks below make sure of it.
    """
    from pyspark.sql import functions as F
    rows = (_read_file(spark, path, 0).groupBy("_block")
            .agg(F.count(F.lit(1)).alias("n"), F.min("_row").alias("lo"), F.max("_row").alias("hi"))
            .orderBy("_block").collect())
    offsets, total = {}, 0
    for r in rows:
        if r["lo"] != 0 or r["hi"] != r["n"] - 1:
            raise CriteoPreprocessError(f"{path}: block at byte {r['_block']} was read in pieces (rows {r['lo']}.."
                                        f"{r['hi']} for {r['n']} lines); cannot number its lines exactly")
        offsets[int(r["_block"])] = total
        total += int(r["n"])
    offsets[-1] = total
    return offsets


def read_raw_with_splits(spark, layout: InputLayout, split_offsets: Dict[int, int],
                         formats: Optional[Dict[str, FileFormat]] = None):
    """Every raw row with its split (``train`` / ``test`` / ``validation``) and, for the split file, its data line
    (``_line``: 0 = the first line after a header). ``formats``: path -> FileFormat (default: TSV, no header)."""
    from pyspark.sql import functions as F
    formats = formats or {}
    split_header = 1 if formats.get(layout.split_file, FileFormat("\t", False)).header else 0
    num_lines = split_offsets[-1] - split_header
    train_end, test_end = split_boundaries(layout.kind, num_lines)
    frames = []
    files = list(layout.train_files) + [layout.split_file]
    for index, path in enumerate(layout.train_files):
        frames.append(_read_file(spark, path, index, formats.get(path))
                      .withColumn("_line", F.lit(None).cast("long"))
                      .withColumn("split", F.lit("train")))
    blocks = spark.createDataFrame([(b, o) for b, o in split_offsets.items() if b >= 0],
                                   "_block long, _block_first_line long")
    split_df = (_read_file(spark, layout.split_file, len(files) - 1, formats.get(layout.split_file))
                .join(F.broadcast(blocks), on="_block", how="left")
                .withColumn("_line", F.col("_block_first_line") + F.col("_row") - F.lit(split_header))
                .drop("_block_first_line"))
    split_df = split_df.withColumn(
        "split", F.when(F.col("_line").isNull(), "unassigned").when(F.col("_line") < train_end, "train").when(F.col("_line") < test_end, "test")
        .otherwise("validation"))
    frames.append(split_df)
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union, {"lines_in_split_file": num_lines, "train_end_line": train_end, "test_end_line": test_end,
                   "split_file_header": bool(split_header)}


# ----------------------------------------------------------------------------------------------------- parsing
def parse_rows(raw):
    """Raw rows -> ``label``, ``num_raw_<i>`` (long or null), ``cat_raw_<i>`` (string or null), ``_reason``, ``_padded``.

    ``_reason`` is null for a good row, else the first problem found (see module docstring).
    """
    from pyspark.sql import functions as F
    # Split once, in its own projection: the optimizer keeps a projection apart when merging it would evaluate an
    # expensive expression (the split) once per use; referenced 40 times, it made parsing ~5x slower.
    keep = ["_file", "_block", "_row", "_line", "split"]
    # One trailing CR (CRLF files) is dropped; endswith + substring, not a regex scanning every line.
    value = F.col("value")
    text = F.when(value.endswith("\r"), F.expr("substring(value, 1, length(value) - 1)")).otherwise(value)
    stage = raw.select(F.col("value").alias("_text"), *keep,
                       F.when(F.col("_sep") == ",", F.split(text, ",", -1))
                       .otherwise(F.split(text, "\t", -1)).alias("_fields"))
    fields = F.col("_fields")

    def field(i: int):
        return F.get(fields, i)

    # The numbers are parsed once, in their own projection too: each is used by the checks and by the output.
    # The label is almost always "0" or "1": compared as text first, the float spellings parsed only otherwise.
    label_text = field(0)
    numbers = stage.select(*[F.col(c) for c in ["_text", "_fields"] + keep],
                           F.when(label_text == "0", F.lit(0).cast("long")).when(label_text == "1", F.lit(1).cast("long"))
                           .otherwise(integral_value(label_text)).alias("_label_value"),
                           *[F.when(field(1 + i) != "", integral_value(field(1 + i))).alias(f"num_raw_{i}")
                             for i in range(NUM_NUMERICAL)])
    count = F.size(fields)
    label, label_value = field(0), F.col("_label_value")
    good_label = label_value.isin(0, 1)
    bad_numerical = [F.when(field(1 + i).isNotNull() & (field(1 + i) != "") & F.col(f"num_raw_{i}").isNull(),
                            F.lit(REASON_BAD_NUMERICAL.format(i + 1)))
                     for i in range(NUM_NUMERICAL)]
    reason = (F.when((count == 1) & (label == ""), F.lit(REASON_EMPTY_LINE))
              .when(count > NUM_FIELDS, F.lit(REASON_TOO_MANY_FIELDS))
              .when(~F.coalesce(good_label, F.lit(False)), F.lit(REASON_BAD_LABEL))
              .otherwise(F.coalesce(*bad_numerical)))
    # A stage boundary between the numbers and the checks: each half then gets its own generated code (measured
    # 2026-11-25, AMD EPYC, 2 cores, 1M rows, cold, back to back: 33.2-34.1 s end to end vs 35.8-38.5 s without).
    numbers = codegen_stage_boundary(numbers)
    columns = [F.col(c) for c in ["_text"] + keep]
    columns.append(reason.alias("_reason"))
    columns.append((count < NUM_FIELDS).alias("_padded"))
    columns.append(F.when(good_label, label_value.cast("int")).alias(LABEL_COLUMN))
    columns += [F.col(f"num_raw_{i}") for i in range(NUM_NUMERICAL)]
    for i in range(NUM_CATEGORICAL):
        t = field(1 + NUM_NUMERICAL + i)
        columns.append(F.when(t != "", t).alias(f"cat_raw_{i}"))
    # The text is kept for the malformed rows only (quoted in the report); good rows do not carry it further.
    return numbers.select(*columns).withColumn("_text", F.when(F.col("_reason").isNotNull(), F.col("_text")))


def integral_value(text):
    """A string column -> its integer value (long), or null when it is not an integral number.

    Read exactly: integers (``260``, ``-3``, ``+7``, up to 18 digits) and decimals whose fraction is zeros (``260.0``,
    ``260.``, ``-0.0``: the integer part). Exponent spellings (``2.6e2``, ``1e3``) count when their value is integral,
    below 2**53, with at most 15 mantissa digits and a 1- or 2-digit exponent, where the double is exact. Null:
    ``2.5``, ``abc``, ``nan``, ``inf``, ``1e300``, ``1.5e0``, padded or quoted text.
    """
    from pyspark.sql import functions as F
    as_double = text.try_cast("double")
    mantissa_digits = F.length(F.regexp_replace(F.regexp_extract(text, r"^[+-]?([0-9.]*)", 1), "[.]", ""))
    # Fast path for the usual spelling, without a regex: a long that prints back as the same text is a plain integer
    # ("260", "-3"; not "+7", "007", " 1", which the regexes below judge) and within INTEGER_RE's 18 digits.
    as_long = text.try_cast("long")
    canonical = as_long.between(-MAX_INTEGER, MAX_INTEGER) & (as_long.cast("string") == text)
    return (F.when(canonical, as_long)
            .when(text.rlike(INTEGER_RE), as_long)
            .when(text.rlike(ZERO_FRACTION_RE), F.regexp_extract(text, r"^([+-]?[0-9]+)", 1).try_cast("long"))
            .when(text.rlike(EXPONENT_RE) & (mantissa_digits <= MAX_MANTISSA_DIGITS)
                  & (F.abs(as_double) < F.lit(MAX_EXACT_DOUBLE_INTEGER)) & (as_double % 1.0 == 0.0),
                  as_double.try_cast("long")))


def value_counts(parsed, dictionary_source: str):
    """One aggregation for the dictionaries and the report: ``column, value, count``.

    ``column`` 0..25 counts categorical values; ``column`` -1 counts rows by ``split|status`` where status is
    ``ok``, ``padded`` or the malformed reason.
    """
    from pyspark.sql import functions as F
    valid = F.col("_reason").isNull()
    counted = valid if dictionary_source == "all" else valid & (F.col("split") == "train")
    status = F.coalesce(F.col("_reason"), F.when(F.col("_padded"), F.lit("padded")).otherwise(F.lit("ok")))
    entries = [F.struct(F.lit(-1).alias("column"), F.concat_ws("|", F.col("split"), status).alias("value"))]
    for i in range(NUM_CATEGORICAL):
        entries.append(F.struct(F.lit(i).alias("column"),
                                F.when(counted, F.col(f"cat_raw_{i}")).alias("value")))
    return (codegen_stage_boundary(parsed).select(F.explode(F.array(*entries)).alias("e"))
            .select("e.column", "e.value").where(F.col("value").isNotNull())
            .groupBy("column", "value").count())


def build_dictionaries(counts, frequency_limit: int):
    """Frequent values -> ids ``2, 3, ...`` by decreasing count, ties by value (deterministic)."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F
    frequent = counts.where((F.col("column") >= 0) & (F.col("count") >= max(frequency_limit, 1)))
    order = Window.partitionBy("column").orderBy(F.desc("count"), F.asc("value"))
    return frequent.withColumn("id", (F.row_number().over(order) + (FIRST_FREQUENT_ID - 1)).cast("int"))


def broadcast_columns(sizes: List[int], budget: int) -> List[int]:
    """Categorical columns whose dictionaries are broadcast to the join: the smallest first, while their values
    add up to at most ``budget`` (``--broadcast_max_rows``); the others are sort-merge joined."""
    small = []
    for i in sorted(range(NUM_CATEGORICAL), key=lambda c: sizes[c]):
        if sizes[i] <= budget:
            small.append(i)
            budget -= sizes[i]
    return sorted(small)


def transform(parsed, dictionaries, sizes: List[int], args: argparse.Namespace):
    """Good rows -> ``split, label, num_0..12 (float), cat_0..25 (int)`` plus ``_file, _block, _row`` (input order).

    A broadcast hash join streams the rows in their order, in the partition they were read in, so with every
    dictionary broadcast the rows stay where they were read and no shuffle happens; a dictionary over the budget is
    sort-merge joined (as NVIDIA's job does), which shuffles.

    Speed: the rows are narrowed to the output's columns before the joins, and each join's id replaces its raw
    value at once, so every join carries the same 42 columns; a codegen stage boundary every
    ``JOINS_PER_CODEGEN_STAGE`` joins keeps each stage's generated method small enough for the JIT (see
    ``codegen_stage_boundary``).
    """
    from pyspark.sql import functions as F
    small = broadcast_columns(sizes, args.broadcast_max_rows)
    out = [F.col("split"), F.col(LABEL_COLUMN).cast("byte").alias(LABEL_COLUMN)]
    for i in range(NUM_NUMERICAL):
        x = F.col(f"num_raw_{i}")
        # NVIDIA: log(x + 3), then fillna(0): Spark's log is NULL for x + 3 <= 0, and missing is NULL.
        out.append(F.when(x.isNotNull() & (x > -3), F.log(x.cast("double") + 3.0)).otherwise(F.lit(0.0))
                   .cast("float").alias(NUMERICAL_COLUMNS[i]))
    out += [F.col(f"cat_raw_{i}") for i in range(NUM_CATEGORICAL)]
    out += [F.col("_file"), F.col("_block"), F.col("_row")]
    df = codegen_stage_boundary(parsed.where(F.col("_reason").isNull())).select(*out)
    # The small dictionaries go into one broadcast table that every join reuses (one broadcast job, not 26), keyed
    # by "<column>:<value>" so that no join condition refers to the table alone (the optimizer would push such a
    # filter into it, and every join would then broadcast its own table).
    shared = (F.broadcast(dictionaries.where(F.col("column").isin(small))
                          .select(F.concat_ws(":", F.col("column"), F.col("value")).alias("key"), F.col("id")))
              if small else None)
    for i in range(NUM_CATEGORICAL):
        raw = f"cat_raw_{i}"
        if i in small:
            d = shared.alias(f"d{i}")
            condition = F.concat(F.lit(f"{i}:"), F.col(raw)) == F.col(f"d{i}.key")
        else:
            d = dictionaries.where(F.col("column") == i).alias(f"d{i}")
            condition = F.col(raw) == F.col(f"d{i}.value")
        ids = (F.when(F.col(raw).isNull(), F.lit(MISSING_ID)).when(F.col(f"d{i}.id").isNull(), F.lit(RARE_ID))
               .otherwise(F.col(f"d{i}.id")).cast("int").alias(CATEGORICAL_COLUMNS[i]))
        df = df.join(d, on=condition, how="left").select(
            *[ids if c == raw else F.col(c) for c in df.columns])
        if (i + 1) % JOINS_PER_CODEGEN_STAGE == 0 and i + 1 < NUM_CATEGORICAL:
            df = codegen_stage_boundary(df)
    return df


def codegen_stage_boundary(df):
    """``df`` unchanged, with a projection that ends Spark's whole-stage code generation there.

    Spark fuses a chain of projections and joins into one generated method per stage; past 8 kB of bytecode the
    JVM does not compile it (HotSpot's huge-method limit) and interprets it, which made the parse and the 26 joins
    of pass 3 run several times slower than compiled (measured: most samples in an interpreted ``processNext``).
    ``reflect`` has no generated code (Spark's ``CodegenFallback``), so a projection using it is a stage boundary;
    it is not deterministic, so the optimizer moves no filter or projection across it, and it rewrites ``split``
    (``String.valueOf``: the same value), which every output needs, so it is never pruned. With
    ``spark.sql.codegen.hugeMethodLimit`` at the JVM's limit (``HUGE_METHOD_LIMIT``), a stage still over it (the
    parse) runs operator by operator, each projection's generated code split into small methods: every row is
    then processed by compiled code.
    """
    from pyspark.sql import functions as F
    return df.withColumn("split", F.expr("reflect('java.lang.String', 'valueOf', `split`)"))


def _write_splits(spark, data, path: str, sort: bool) -> None:
    """``data`` partitioned by ``split`` into ``path/split=<name>``, each task's rows in the order they come.

    Spark's partitioned writer sorts each task's rows by the partition column first, unless the rows are sorted
    by it already (``sort``: a global sort by split) or concurrent writers are allowed; here one writer per split
    (``spark.sql.maxConcurrentOutputFileWriters``, for this write only) keeps each task's rows in their order
    without a sort.
    """
    writers = contextlib.nullcontext() if sort else _session_conf(spark, "spark.sql.maxConcurrentOutputFileWriters",
                                                                  str(len(SPLITS)))
    with writers:
        data.write.partitionBy("split").parquet(path)


@contextlib.contextmanager
def _session_conf(spark, key: str, value: str):
    """``spark.conf`` ``key`` set to ``value`` inside the block, its previous value restored after (errors too)."""
    previous = spark.conf.get(key)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        spark.conf.set(key, previous)


def shuffle_train(spark, source: str, target: str, seed: int, partitions: int) -> None:
    """``--train_ordering random``: the train parquet files at ``source`` (input order) -> ``target``, rows in a
    pseudo-random order fixed by ``seed``.

    Each row's key is a 64-bit hash of the seed and the row's place in ``source`` (part file number, row within the
    file), so the order does not depend on how Spark splits the files into tasks; rows are hash-partitioned by the
    key into ``partitions`` tasks (a fixed count, which adaptive execution keeps) and sorted by it within each, so
    part files sorted by name give the shuffled order. Reading the compact parquet back costs far less than a
    global sort of the rows while they are parsed from text.
    """
    from pyspark.sql import functions as F
    rows = spark.read.parquet(source)
    part = F.regexp_extract(F.col("_metadata.file_name"), r"^part-([0-9]+)", 1).cast("long")
    key = F.xxhash64(F.lit(seed), part, F.col("_metadata.row_index"))
    columns = [LABEL_COLUMN] + NUMERICAL_COLUMNS + CATEGORICAL_COLUMNS
    (rows.select(*columns, key.alias("_key")).repartition(partitions, "_key").sortWithinPartitions("_key")
     .drop("_key").write.parquet(target))


# ----------------------------------------------------------------------------------------------------- the job
def _status_counts(rows) -> Dict[str, Dict[str, int]]:
    out: Dict[str, Dict[str, int]] = {s: {} for s in SPLITS}
    for r in rows:
        split, status = r["value"].split("|", 1)
        out.setdefault(split, {})[status] = int(r["count"])
    return out


def run(args: argparse.Namespace, spark) -> Dict[str, Any]:
    """Run the job with an existing SparkSession; returns the report (also written to preprocess_report.json)."""
    # Generated methods over the JVM's huge-method limit are interpreted: Spark runs such a stage operator by
    # operator instead (see codegen_stage_boundary). Set for this job only, unless --spark_conf sets it.
    key = "spark.sql.codegen.hugeMethodLimit"
    if any(item.split("=", 1)[0].strip() == key for item in args.spark_conf):
        return _run(args, spark)
    with _session_conf(spark, key, str(HUGE_METHOD_LIMIT)):
        return _run(args, spark)


def _run(args: argparse.Namespace, spark) -> Dict[str, Any]:
    """The job's passes, top to bottom; everything is written inside one atomic output directory."""
    started = time.time()
    layout = discover_input(args.input_path, args.layout)
    report: Dict[str, Any] = {"input": layout.describe(), "frequency_limit": args.frequency_limit,
                              "dictionary_source": args.dictionary_source, "train_ordering": args.train_ordering,
                              "seed": args.seed, "ids": {"missing": MISSING_ID, "rare_or_unseen": RARE_ID,
                                                          "first_frequent": FIRST_FREQUENT_ID}}
    print(f"[criteo] {layout.kind} layout: {len(layout.train_files)} train file(s) + split file "
          f"{os.path.basename(layout.split_file)}", flush=True)
    formats = input_formats(layout, args.header, args.delimiter)
    report["input_format"] = {os.path.basename(p): f.describe() for p, f in formats.items()}
    for kind, names in _format_summary(formats).items():
        print(f"[criteo] {kind}: {names}", flush=True)
    # cardinalities.json (which to_split_binary needs first) is the marker: removed first, written last.
    with atomic_directory(args.output_path, overwrite=args.overwrite, tool="recsys_common.criteo.spark_preprocess",
                          marker="cardinalities.json") as out:
        work = os.path.join(out, "_work")
        parsed, counts = _read_and_count(spark, layout, formats, args, report, work, started)
        _report_malformed(parsed, layout, formats, args, report)
        dictionaries, sizes = _dictionaries(spark, counts, args, out, report, started)
        _write_outputs(spark, transform(parsed, dictionaries, sizes, args), sizes, args, work, out, report, started)
        _remove_tree(work)
        _write_metadata(out, report, started)
    print(f"[criteo] wrote {args.output_path}: rows {json.dumps(report['rows_written'])}, "
          f"malformed {malformed_total(report)}, padded {sum(report['rows_padded'].values())}, "
          f"{report['seconds']} s", flush=True)
    return report


def _read_and_count(spark, layout: InputLayout, formats: Dict[str, FileFormat], args: argparse.Namespace,
                    report: Dict[str, Any], work: str, started: float):
    """Pass 1 (number the split file's lines, read and parse every row) and pass 2 (value counts, written once and
    read twice); fills the report's row counts. Returns (parsed rows, counts)."""
    from pyspark.sql import functions as F
    offsets = block_line_offsets(spark, layout.split_file)
    _progress(started, f"pass 1: {offsets[-1]} lines in {os.path.basename(layout.split_file)}")
    raw, split_info = read_raw_with_splits(spark, layout, offsets, formats)
    report["split"] = split_info
    parsed = parse_rows(raw)
    value_counts(parsed, args.dictionary_source).write.parquet(os.path.join(work, "counts"))
    counts = spark.read.parquet(os.path.join(work, "counts"))
    _progress(started, "pass 2: value counts")
    status = _status_counts(counts.where(F.col("column") == -1).collect())
    unassigned = status.pop("unassigned", {})
    rows_read = {s: sum(v.values()) for s, v in status.items()}
    malformed = {s: {k: v for k, v in status[s].items() if k not in ("ok", "padded")} for s in SPLITS}
    report["rows_read"] = rows_read
    report["rows_padded"] = {s: status[s].get("padded", 0) for s in SPLITS}
    report["rows_malformed"] = malformed
    report["rows_written"] = rows_written(rows_read, malformed)
    split_file_rows = (rows_read["test"] + rows_read["validation"] +
                       (rows_read["train"] if layout.kind == "kaggle" else 0))
    if unassigned or split_file_rows != split_info["lines_in_split_file"]:
        raise CriteoPreprocessError(f"{layout.split_file}: {split_file_rows} rows were assigned to splits by line "
                                    f"number ({sum(unassigned.values())} without one) but the file has "
                                    f"{split_info['lines_in_split_file']} lines")
    return parsed, counts


def _report_malformed(parsed, layout: InputLayout, formats: Dict[str, FileFormat], args: argparse.Namespace,
                      report: Dict[str, Any]) -> None:
    """Quote up to ``--max_examples`` malformed rows (file, line, split, reason, text) and apply the shared rule
    (:func:`.report.check_malformed`)."""
    from pyspark.sql import functions as F
    if malformed_total(report):
        examples = (parsed.where(F.col("_reason").isNotNull())
                    .select("_file", "_block", "_row", "_line", "split", "_reason",
                            F.substring("_text", 1, _MAX_EXAMPLE_CHARS).alias("text"))
                    .limit(args.max_examples).collect())
        files = list(layout.train_files) + [layout.split_file]
        lines = example_line_numbers(examples, files, formats)
        report["malformed_examples"] = [
            {"file": os.path.basename(files[r["_file"]]), "line": line,
             "split": r["split"], "reason": r["_reason"], "text": r["text"]} for r, line in zip(examples, lines)]
    check_malformed(args.input_path, report, report.get("malformed_examples", []), args.max_malformed_fraction)


def _dictionaries(spark, counts, args: argparse.Namespace, out: str, report: Dict[str, Any], started: float):
    """The dictionaries (``out/models``), checked to number their values densely; (dictionaries, sizes)."""
    from pyspark.sql import functions as F
    build_dictionaries(counts, args.frequency_limit).write.parquet(os.path.join(out, "models"))
    dictionaries = spark.read.parquet(os.path.join(out, "models"))
    size_rows = (dictionaries.groupBy("column")
                 .agg(F.count(F.lit(1)).alias("n"), F.max("id").alias("max_id")).collect())
    sizes = [0] * NUM_CATEGORICAL
    for r in size_rows:
        sizes[int(r["column"])] = int(r["n"])
        if int(r["max_id"]) != int(r["n"]) + FIRST_FREQUENT_ID - 1:
            raise CriteoPreprocessError(f"dictionary of column {r['column']} has {r['n']} values but max id "
                                        f"{r['max_id']}")
    report["cardinalities"] = [n + FIRST_FREQUENT_ID for n in sizes]
    _progress(started, f"dictionaries: cardinalities {report['cardinalities']}")
    return dictionaries, sizes


def _write_outputs(spark, data, sizes: List[int], args: argparse.Namespace, work: str, out: str,
                   report: Dict[str, Any], started: float) -> None:
    """Pass 3: transform and write the splits in input order, one job. With every dictionary broadcast the rows
    stay in the tasks that read them (one input block each, in file then block order), so sorting each task's
    rows by (split, row) is enough: its part file per split holds them in line order, and part files sorted by
    name follow the input. A sort-merge-joined dictionary moves rows between tasks: then a global sort.
    Pass 4 (``--train_ordering random``): the train rows shuffled from the compact parquet just written."""
    in_place = len(broadcast_columns(sizes, args.broadcast_max_rows)) == NUM_CATEGORICAL
    if not in_place:
        data = data.orderBy("split", "_file", "_block", "_row")
    _write_splits(spark, data.drop("_file", "_block", "_row"), os.path.join(work, "splits"), sort=not in_place)
    _progress(started, "pass 3: splits written")
    for split in SPLITS:
        source = os.path.join(work, "splits", f"split={split}")
        target = os.path.join(out, split)
        if not os.path.isdir(source):
            os.makedirs(target)   # an empty split (e.g. no validation rows in a tiny input)
        elif split == "train" and args.train_ordering == "random":
            partitions = args.shuffle_partitions or max(spark.sparkContext.defaultParallelism,
                                                        -(-report["rows_written"]["train"] // 2_000_000))
            shuffle_train(spark, source, target, args.seed, partitions)
            _progress(started, f"pass 4: train rows shuffled ({partitions} part files)")
        else:
            os.replace(source, target)


def _write_metadata(out: str, report: Dict[str, Any], started: float) -> None:
    """model_size.json, cardinalities.json (the marker) and preprocess_report.json."""
    cardinalities = report["cardinalities"]
    atomic_write_text(os.path.join(out, "model_size.json"),
                      json.dumps({f"_c{1 + NUM_NUMERICAL + i}": c - 1 for i, c in enumerate(cardinalities)},
                                 indent=2) + "\n")
    atomic_write_text(os.path.join(out, "cardinalities.json"), json.dumps(cardinalities) + "\n")
    report["seconds"] = round(time.time() - started, 1)
    atomic_write_text(os.path.join(out, "preprocess_report.json"), json.dumps(report, indent=2) + "\n")


def input_formats(layout: InputLayout, header: str, delimiter: str) -> Dict[str, FileFormat]:
    """path -> FileFormat of every input file, from its first line (read on the driver before Spark starts work)."""
    return {path: sniff_format(path, header, delimiter) for path in list(layout.train_files) + [layout.split_file]}


def _format_summary(formats: Dict[str, FileFormat]) -> Dict[str, str]:
    """'tab-separated' / 'comma-separated, header skipped' -> the file names in that format, for the console."""
    kinds: Dict[str, List[str]] = {}
    for path, fmt in formats.items():
        kind = ("tab" if fmt.delimiter == "\t" else "comma") + "-separated" + (", header line skipped" if fmt.header
                                                                                else "")
        kinds.setdefault(kind, []).append(os.path.basename(path))
    return {k: ", ".join(v) for k, v in kinds.items()}


def example_line_numbers(examples, files: List[str], formats: Dict[str, FileFormat]) -> List[int]:
    """1-based line number in its file of each malformed example (rows with ``_file, _block, _row, _line``).

    The split file's lines are numbered already (pass 1). In another file a row's line is the number of lines before
    its block plus its row in the block: rows of the first block (every row of a .gz file) need nothing more; for
    later blocks the lines before the block are counted here, once per file, only up to the furthest example (the
    examples are few, and this runs only when there are malformed rows).
    """
    split_index = len(files) - 1
    header = {i: 1 if formats.get(p, FileFormat("\t", False)).header else 0 for i, p in enumerate(files)}
    needed: Dict[int, List[int]] = {}
    for r in examples:
        if r["_file"] != split_index and int(r["_block"]) > 0:
            needed.setdefault(int(r["_file"]), []).append(int(r["_block"]))
    lines_before = {i: _count_lines_before(files[i], sorted(set(blocks))) for i, blocks in needed.items()}
    out = []
    for r in examples:
        if r["_file"] == split_index and r["_line"] is not None:
            out.append(int(r["_line"]) + header[split_index] + 1)
        else:
            before = lines_before.get(int(r["_file"]), {}).get(int(r["_block"]), 0)
            out.append(before + int(r["_row"]) + 1)
    return out


def _count_lines_before(path: str, offsets: List[int]) -> Dict[int, int]:
    """``{block start byte: lines of the file before that block}`` for sorted offsets of an uncompressed file.

    Hadoop's line reader (under ``spark.read.text``) gives a block that starts at byte ``b > 0`` the lines that
    begin after ``b``: it skips up to and including the first newline at or after ``b``, and the previous block
    reads every line that begins at or before ``b``. So the lines before it are the first line plus one per newline
    in bytes ``[0, b)``.
    """
    counts, seen, position = {}, 0, 0
    with open(path, "rb") as f:
        for offset in offsets:
            target = offset
            while position < target:
                chunk = f.read(min(1 << 24, target - position))
                if not chunk:
                    break
                seen += chunk.count(b"\n")
                position += len(chunk)
            counts[offset] = 1 + seen
    return counts


def _progress(started: float, message: str) -> None:
    print(f"[criteo] {time.time() - started:7.1f} s  {message}", flush=True)


def _remove_tree(path: str) -> None:
    import shutil
    shutil.rmtree(path, ignore_errors=True)


def main(argv: Optional[Sequence[str]] = None, spark=None) -> Dict[str, Any]:
    """Entry point; ``spark``: an existing session to use (tests share one), else one is created and stopped."""
    args = parse_args(argv)
    layout = discover_input(args.input_path, args.layout)   # fail on a wrong path before starting Spark
    input_formats(layout, args.header, args.delimiter)       # and on an unreadable file
    check_output_directory(args.output_path, args.overwrite)   # and on a non-empty output directory
    own_session = spark is None
    if own_session:
        spark = create_session(args)
    try:
        return run(args, spark)
    finally:
        if own_session:
            spark.stop()


if __name__ == "__main__":
    from recsys_common.cli import run_main
    run_main(main, input_errors=(CriteoInputError, CriteoPreprocessError, FileExistsError))
