"""Single-machine Criteo preprocessing (Polars): raw TSV -> NVIDIA's split-binary dataset in one command.

    python -m recsys_common.criteo.polars_preprocess --input_path /data/dlrm/criteo --output_path /data/dlrm/binary_dataset

The default engine of both DLRM recipes' ``prepare_dataset.sh`` (Spark, ``spark_preprocess`` + ``to_split_binary``,
stays the cluster engine). Same semantics and, for ``--train_ordering input``, the same bytes as the Spark path on the
same input and flags (``common/tests/test_criteo_engine.py`` compares them): the splits of ``layout.py``, the row
rules of ``spark_preprocess`` (padding, malformed reasons, ``integral_value``), ``log(x + 3)`` computed in double,
stored as float32 then float16, and the dictionaries of ``dictionaries.py``. With ``--train_ordering random`` (the
default, as NVIDIA's) the train rows are a uniformly random permutation drawn from ``--seed``: the same rows as
Spark's, in another order (Spark's order depends on its partitioning).

Bounded memory: the input is read in chunks of ``--chunk_mb`` of text, never a whole file, two chunks in flight (one
per core); the train shuffle holds at most ``--shuffle_memory_mb``. Peak memory is set by these, not by the rows.

1. *Count* (one pass over the raw text): parse each chunk once (Polars' CSV reader; the categorical columns
   dictionary-encoded by Arrow, 8-byte values such as Criteo's hex ids as one uint64 each, kept as integers through
   counting and the lookups of pass 2); keep label, float16 numericals and, per categorical column, the chunk's
   distinct values and each row's index into them: in memory when the input is at most ``--hold_input_mb`` of text,
   else in ``<work>/files/<n>/chunk_<k>.*``; sum the value counts per file (``counts.parquet``). Pass 2 never reads
   the text again.
2. *Dictionaries*: sum the files' counts per column (Polars lazy scan + group-by), keep values seen at least
   ``--frequency_limit`` times (``dictionaries.build_dictionary``). They are saved with the dataset
   (``dictionaries/<i>.parquet`` and ``dictionaries/criteo.json``, as the Spark path's ``to_split_binary`` saves
   them), so that raw values sent later map as in training (``recsys_common.serving.raw_features``).
3. *Map and write*: per chunk, look up its distinct values (not its rows) in the dictionaries and write each split's
   ``label.bin``, ``numerical.bin``, ``cat_<i>.bin``. Train rows with ``--train_ordering random``: when they fit
   ``--shuffle_memory_mb``, they are held in memory and written once, permuted; otherwise they go to bucket files
   first (a random bucket per row), then each bucket is permuted in memory and appended: an external shuffle.

Resumable: the work directory (``--work_dir``, default ``OUTPUT_PATH.work``) records each finished file and bucket in
``state.json``; a killed run, started again with the same arguments, skips them (output files are cut back to their
recorded sizes); a run that held its chunks in memory (``--hold_input_mb``) has nothing to resume from and starts
over. Outputs land in ``--output_path`` only when all is done (``io.atomic_directory``, marker
``feature_spec.yaml``); a non-empty output directory is refused unless ``--overwrite``. Malformed rows are counted
per reason, reported with file and line, and fail the run above ``--max_malformed_fraction``.
"""
from __future__ import annotations

if __name__ == "__main__":
    # The command line (see main): no garbage collections at all, from the first import on.
    import gc
    gc.disable()

import argparse
import gzip
import json
import os
import shutil
import time
import zlib
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

# Polars (and pyarrow) are imported inside the functions that use them, on purpose: tune_allocators() must run
# before Polars loads (it reads its allocator settings once, at import).
from . import (CATEGORICAL_COLUMNS, DEFAULT_FREQUENCY_LIMIT, FIRST_FREQUENT_ID, MISSING_ID, NUM_CATEGORICAL,
               NUM_FIELDS, NUM_NUMERICAL, RARE_ID, REASON_BAD_LABEL, REASON_BAD_NUMERICAL, REASON_EMPTY_LINE,
               REASON_TOO_MANY_FIELDS, SPLITS)
from .layout import (DELIMITER_CHOICES, EXPONENT_RE, HEADER_CHOICES, INTEGER_RE, MAX_EXACT_DOUBLE_INTEGER,
                     MAX_MANTISSA_DIGITS, ZERO_FRACTION_RE, CriteoInputError, FileFormat, InputLayout,
                     discover_input, sniff_format, split_boundaries)
from .report import CriteoPreprocessError, check_malformed, malformed_total
from .to_split_binary import dataset_metadata
from ..feature_spec import FeatureSpec
from ..io import atomic_directory, atomic_write_text, check_output_directory
from ..logger import hms
from ..machine import glibc_malloc_options
from ..prefetch import prefetched

TOOL = "recsys_common.criteo.to_split_binary"   # the same dataset either engine writes: each may replace the other's
_STATE_VERSION = 1
_MAX_EXAMPLE_CHARS = 300
_BOM = b"\xef\xbb\xbf"
_REASONS = [REASON_EMPTY_LINE, REASON_TOO_MANY_FIELDS, REASON_BAD_LABEL] + [
    REASON_BAD_NUMERICAL.format(i + 1) for i in range(NUM_NUMERICAL)]
_NAMES = ["label"] + [f"i{i}" for i in range(NUM_NUMERICAL)] + [f"c{i}" for i in range(NUM_CATEGORICAL)]
_INT_COLUMNS = _NAMES[:1 + NUM_NUMERICAL]


# Fault injection for the resume tests: "<step>:<n>" SIGKILLs this process right after the n-th (1-based) record
# of that step ("count" = a file of pass 1, "write" = a file of pass 2, "permute" = a train column file, "bucket") is
# saved, i.e. at the worst moment for a resume.
_KILL_ENV = "RECSYS_CRITEO_TEST_SIGKILL_AT"


def _maybe_killed(step: str, n: int) -> None:
    if os.environ.get(_KILL_ENV) == f"{step}:{n}":
        import signal
        os.kill(os.getpid(), signal.SIGKILL)


# ----------------------------------------------------------------------------------------------------- reading
@dataclass
class RawChunk:
    data: bytes          # whole lines, each ending in b"\n", CR line ends normalised, header removed
    first_line: int      # data-line index (0 = first line after a header) of the chunk's first line
    num_lines: int
    bom_line: bool       # the chunk's first line started with a UTF-8 byte-order mark (kept as text by Spark)
    position: int        # bytes of the file on disk consumed so far (compressed bytes for .gz)


def count_byte(data: bytes, byte: int, block: int = 1 << 20) -> int:
    """``data.count(bytes([byte]))`` with NumPy's vector compare, a block at a time (the compare's temporary stays
    small and cached): several times faster than ``bytes.count`` on bytes as frequent as Criteo's tabs."""
    a = np.frombuffer(data, dtype=np.uint8)
    return sum(int(np.count_nonzero(a[i:i + block] == byte)) for i in range(0, len(a), block))


def _normalise_line_ends(data: bytes) -> bytes:
    # Spark's text reader (Hadoop's LineReader) ends a line at \n, \r\n or a lone \r.
    if b"\r" in data:
        data = data.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return data


def iter_line_chunks(path: str, fmt: FileFormat, chunk_bytes: int = 32 << 20) -> Iterator[RawChunk]:
    """The file's lines in chunks of about ``chunk_bytes``; ``.gz`` is decompressed as a stream. A truncated or
    corrupt gzip raises ``CriteoInputError`` naming the file and the last complete line."""
    raw = open(path, "rb")
    compressed = path.endswith(".gz")
    stream = gzip.GzipFile(fileobj=raw) if compressed else raw
    carry, line, first = b"", 0, True
    plain = None if compressed else _plain_line_blocks(raw, chunk_bytes)
    try:
        while True:
            if plain is not None:
                block = data = next(plain, b"")
                if not data:
                    return
                if not data.endswith(b"\n"):
                    data += b"\n"       # last line without a line end
            else:
                try:
                    block = stream.read(chunk_bytes)
                except (EOFError, OSError, zlib.error) as e:
                    raise CriteoInputError(f"{path}: truncated or corrupt compressed data after line "
                                           f"{line + (1 if fmt.header else 0)}: {e}") from None
                if block:
                    cut = block.rfind(b"\n")
                    if cut < 0:
                        carry += block   # a line longer than a chunk: read on
                        continue
                    data = carry + block[:cut + 1] if carry else block[:cut + 1]
                    carry = block[cut + 1:]
                else:
                    data, carry = (carry + b"\n" if carry else b""), b""   # last line without a line end
                    if not data:
                        return
            data = _normalise_line_ends(data)
            bom = False
            if first:
                if fmt.header:
                    data = data[data.find(b"\n") + 1:]
                elif data.startswith(_BOM):
                    data, bom = data[len(_BOM):], True
                first = False
            n = count_byte(data, 10)
            if n:
                yield RawChunk(data, line, n, bom, raw.tell())
            line += n
            if not block:
                return
    finally:
        stream.close()
        raw.close()


def _plain_line_blocks(f, chunk_bytes: int, probe_bytes: int = 1 << 20) -> Iterator[bytes]:
    """An uncompressed file in blocks of whole lines of about ``chunk_bytes`` (the last block may lack its line end),
    each read with one exact-size read: the end of a block's last line is found first with small reads, so no block
    is copied to cut it (that copy and its fresh pages cost as much as the read itself)."""
    fd = f.fileno()
    size = os.fstat(fd).st_size
    pos = 0
    while pos < size:
        end = min(pos + chunk_bytes, size)
        if end < size:
            window = max(pos, end - probe_bytes)
            cut = os.pread(fd, end - window, window).rfind(b"\n")
            if cut >= 0:
                end = window + cut + 1
            else:   # no line end in the last probe_bytes before `end`: the block ends at the next one
                while end < size:
                    probe = os.pread(fd, probe_bytes, end)
                    cut = probe.find(b"\n")
                    if cut >= 0:
                        end += cut + 1
                        break
                    end += len(probe)
        parts = []
        at = pos
        while at < end:   # pread may return less than asked (only at the end of a file that shrank)
            part = os.pread(fd, end - at, at)
            if not part:
                raise CriteoInputError(f"{f.name}: the file became shorter while it was read")
            parts.append(part)
            at += len(part)
        f.seek(end)       # position, as the progress reports it
        yield parts[0] if len(parts) == 1 else b"".join(parts)
        pos = end


# ----------------------------------------------------------------------------------------------------- parsing
@dataclass
class ParsedChunk:
    """The good rows of one chunk, in line order, and what was wrong with the others."""
    num_lines: int
    label: np.ndarray                  # int8 [n]
    numerical: np.ndarray              # float16 [n, 13]
    codes: np.ndarray                  # uint32 [26, n] (column-major): 0 missing, k = uniques[c][k - 1]
    uniques: List[Any]                 # per column, the chunk's distinct values: uint64 NumPy array when they are
                                       # all 8 bytes long (``_encode_words``), else a pyarrow string array
    lines: np.ndarray                  # int64 [n]: data-line index in the file of each good row
    padded: np.ndarray                 # bool [n]: the row had fewer than 40 fields
    malformed_lines: np.ndarray        # int64 [m]
    malformed_reasons: np.ndarray      # int16 [m]: index into _REASONS
    malformed_text: Dict[int, Tuple[str, str]] = field(default_factory=dict)   # a few: line -> (reason, text)


def _read_frame(data: bytes, separator: str):
    """All 40 fields as text (empty -> null); a line with fewer fields gets nulls (Spark pads it), a line with more
    makes Polars raise (the caller then drops such lines first)."""
    import polars as pl
    if not data:
        return pl.DataFrame(schema={n: pl.Utf8 for n in _NAMES})
    return pl.read_csv(data, separator=separator, has_header=False, new_columns=_NAMES,
                       schema={n: pl.Utf8 for n in _NAMES}, truncate_ragged_lines=False,
                       quote_char=None, missing_columns="insert", encoding="utf8-lossy", raise_if_empty=False)


def _read_typed(data: bytes, separator: str):
    """The fast reading: label and integer fields parsed as Int64 by the CSV reader itself. Returns None when that
    cannot be trusted to give Spark's answer, so that the caller reads the text (``_read_frame``): a field that is
    not a plain integer (the reader raises), a line with more than 40 fields (raises), a space or, in a comma file, a
    tab anywhere in the chunk (the reader skips blanks before a number, Spark does not), a value of 19 digits
    (Spark's limit is 18), or text that is not valid UTF-8 (strict decoding validates the whole chunk at once, about
    a quarter faster than the lossy decoding's check per field; ``_read_frame`` decodes such text lossily, as Spark
    does)."""
    import polars as pl
    if b" " in data or (separator != "\t" and b"\t" in data):
        return None
    schema = {n: (pl.Utf8 if n.startswith("c") else pl.Int64) for n in _NAMES}
    try:
        frame = pl.read_csv(data, separator=separator, has_header=False, new_columns=_NAMES, schema=schema,
                            truncate_ragged_lines=False, quote_char=None, missing_columns="insert",
                            encoding="utf8", raise_if_empty=False)
    except pl.exceptions.PolarsError:   # ComputeError / SchemaError: a bad integer, a line of 41+ fields, bad UTF-8
        return None
    limit = 10 ** 18
    if frame.select(pl.any_horizontal([(pl.col(n).abs() >= limit).any() for n in _INT_COLUMNS])).item():
        return None
    return frame


def integral_value(text):
    """Polars expression: a string -> its integer value (Int64), or null when it is not an integral number.

    The rules of ``spark_preprocess.integral_value`` (same regular expressions): ``260``, ``+7`` (up to 18 digits),
    ``260.0`` (zeros after the point), and exponent spellings with at most 15 mantissa digits, a 1- or 2-digit
    exponent and an integral value below 2**53."""
    import polars as pl
    as_double = text.cast(pl.Float64, strict=False)
    mantissa = text.str.extract(r"^[+-]?([0-9.]*)", 1).str.replace_all(".", "", literal=True).str.len_chars()
    return (pl.when(text.str.contains(INTEGER_RE)).then(text.cast(pl.Int64, strict=False))
            .when(text.str.contains(ZERO_FRACTION_RE))
            .then(text.str.extract(r"^([+-]?[0-9]+)", 1).cast(pl.Int64, strict=False))
            .when(text.str.contains(EXPONENT_RE) & (mantissa <= MAX_MANTISSA_DIGITS)
                  & (as_double.abs() < MAX_EXACT_DOUBLE_INTEGER) & (as_double == as_double.floor()))
            .then(as_double.cast(pl.Int64, strict=False))
            .otherwise(None))


def _integers(frame) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(values int64 [n, 14], present bool [n, 14], bad bool [n, 14]) of the label and the 13 integer columns under
    ``integral_value``'s rules. Fast for plain integers (one strict cast, checked against Spark's 18-digit limit, all
    columns in one parallel select); only the values that fail it go through the regular expressions."""
    import polars as pl
    exprs = []
    for name in _INT_COLUMNS:
        text = pl.col(name)
        value = text.cast(pl.Int64, strict=False)
        digits = text.str.len_bytes() - text.str.starts_with("+").cast(pl.UInt32) - text.str.starts_with(
            "-").cast(pl.UInt32)
        exprs.append(pl.when(digits <= 18).then(value).alias(name))
    fast = frame.select(exprs)
    present = frame.select(pl.all().is_not_null()).select(_INT_COLUMNS).to_numpy()
    values_null = fast.select(pl.all().is_null()).to_numpy()
    values = fast.fill_null(0).to_numpy()
    slow = present & values_null
    bad = np.zeros(values.shape, dtype=bool)
    for j in np.flatnonzero(slow.any(axis=0)):
        index = np.flatnonzero(slow[:, j])
        name = _INT_COLUMNS[j]
        exact = frame.select(pl.col(name).gather(index)).select(integral_value(pl.col(name)).alias("v"))["v"]
        values[index, j] = exact.fill_null(0).to_numpy()
        bad[index, j] = exact.is_null().to_numpy()
    return values, present, bad


def _line_offsets(data: bytes, block: int = 1 << 20) -> Tuple[np.ndarray, np.ndarray]:
    """(start, end) byte offsets of each line (``end`` is its ``\\n``). Found a block at a time: the compare's
    temporary stays cached (about 2x faster than one ``flatnonzero`` over a 32 MiB chunk)."""
    a = np.frombuffer(data, dtype=np.uint8)
    ends = np.concatenate([np.flatnonzero(a[i:i + block] == 10) + i for i in range(0, len(a), block)]) \
        if len(a) else np.zeros(0, np.int64)
    starts = np.concatenate([[0], ends[:-1] + 1]) if len(ends) else ends
    return starts, ends


def _fields_per_line(data: bytes, separator: str, ends: np.ndarray) -> np.ndarray:
    separators = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == ord(separator))
    return np.diff(np.searchsorted(separators, ends), prepend=0) + 1


def _fields_of_candidates(data: bytes, separator: str, frame, rows: np.ndarray, starts: np.ndarray,
                          ends: np.ndarray) -> np.ndarray:
    """Fields of the lines ``rows`` (of at most 40 fields, all read into ``frame``), without a pass over their
    bytes: a line's fields are its last non-empty field's index + 1 + the separators after it, which end the line
    (the fields after it are empty). Only the run of separators before each line end is looked at. A line with no
    non-empty field (an unlabeled, hence malformed, row) gets its separators + 1."""
    import polars as pl
    present = frame.select(pl.all().is_not_null().gather(rows)).to_numpy()       # [m, 40]
    any_present = present.any(axis=1)
    last = NUM_FIELDS - 1 - np.argmax(present[:, ::-1], axis=1)
    a = np.frombuffer(data, dtype=np.uint8)
    end, start = ends[rows], starts[rows]
    run = np.zeros(len(rows), dtype=np.int64)
    open_ = np.ones(len(rows), dtype=bool)
    code = ord(separator)
    for back in range(1, NUM_FIELDS + 1):   # at most 40 trailing separators matter (more: > 40 fields anyway)
        at = end - back
        open_ &= at >= start
        if not open_.any():
            break
        open_ &= a[np.maximum(at, 0)] == code
        run += open_
    return np.where(any_present, last + 1 + run, run + 1)


def _line_text(data: bytes, starts: np.ndarray, ends: np.ndarray, line: int) -> str:
    return data[starts[line]:ends[line]][:_MAX_EXAMPLE_CHARS * 4].decode("utf-8", "replace")[:_MAX_EXAMPLE_CHARS]


def _codes(indices) -> np.ndarray:
    """Arrow int32 dictionary indices (null = missing) -> uint32 codes, 0 = missing and k = (k-1)-th value. Read from
    the array's buffers: ``pyarrow.compute.fill_null`` would make a pyarrow scalar, whose first use imports pandas
    (half a second, a quarter of a 1M-row run)."""
    n, offset = len(indices), indices.offset
    validity, data = indices.buffers()
    codes = np.frombuffer(data, dtype=np.int32, count=n, offset=offset * 4).view(np.uint32) + np.uint32(1)
    if indices.null_count:
        codes *= np.unpackbits(np.frombuffer(validity, dtype=np.uint8), count=offset + n, bitorder="little")[offset:]
    return codes


def _encode(array):
    """pyarrow string array -> (codes uint32 with 0 = null and k = k-th distinct value, distinct values)."""
    import pyarrow.compute as pc
    encoded = pc.dictionary_encode(array)
    if hasattr(encoded, "combine_chunks"):
        encoded = encoded.combine_chunks()
    return _codes(encoded.indices), encoded.dictionary


def _encode_words(words):
    """``_encode`` for a column whose values are all 8 bytes long (Criteo's hex ids), given as their bytes read as
    big-endian uint64 (pyarrow array): hashing an integer is much cheaper than hashing a string. The distinct
    values stay integers (uint64 NumPy array) through counting and mapping, which are cheaper on integers too;
    ``words_to_text`` turns them back into the strings where the dictionaries are built. Big-endian keeps the
    order: integers compare as the strings' bytes do."""
    import pyarrow.compute as pc
    encoded = pc.dictionary_encode(words)
    if hasattr(encoded, "combine_chunks"):
        encoded = encoded.combine_chunks()
    keys = encoded.dictionary      # no nulls; read from its buffer (pyarrow's to_numpy imports pandas, see _codes)
    return _codes(encoded.indices), np.frombuffer(keys.buffers()[1], dtype=np.uint64, count=len(keys),
                                                  offset=keys.offset * 8)


def words_to_text(words: np.ndarray):
    """uint64 keys of ``_encode_words`` -> the 8-byte strings they were read from (Polars Utf8 Series)."""
    import polars as pl
    import pyarrow as pa
    raw = np.ascontiguousarray(words, dtype=">u8")
    values = pa.FixedSizeBinaryArray.from_buffers(pa.binary(8), len(raw), [None, pa.py_buffer(raw)])
    return pl.from_arrow(values.cast(pa.binary()).cast(pa.string())).cast(pl.Utf8)


def text_to_words(values):
    """The 8-byte strings of a Polars Utf8 Series as ``_encode_words`` keys: (row indices, uint64 keys) of those of
    them that are 8 bytes long (no other string can equal an 8-byte value)."""
    import polars as pl
    is_word = (values.str.len_bytes() == 8).fill_null(False).to_numpy()
    rows = np.flatnonzero(is_word)
    keys = values.gather(rows).cast(pl.Binary).bin.reinterpret(dtype=pl.UInt64, endianness="big").to_numpy()
    return rows, keys.astype(np.uint64)


class WordLookup:
    """``DictionaryLookup`` for ``_encode_words`` keys: the dictionary's 8-byte values as sorted uint64, looked up by
    binary search; equal keys are equal strings, so the answer is exact."""

    def __init__(self, dictionary):
        rows, keys = text_to_words(dictionary["value"])
        order = np.argsort(keys)
        self._keys = keys[order]
        self._ids = dictionary["id"].to_numpy()[rows][order].astype(np.int64)

    def ids(self, keys: np.ndarray) -> np.ndarray:
        """Ids (int64) of ``keys``: the dictionary's id, or ``RARE_ID`` for a value not in it."""
        if not len(self._keys):
            return np.full(len(keys), RARE_ID, dtype=np.int64)
        pos = np.minimum(np.searchsorted(self._keys, keys), len(self._keys) - 1)
        return np.where(self._keys[pos] == keys, self._ids[pos], RARE_ID)


class ColumnLookup:
    """One column's value -> id, for distinct values of either kind (uint64 keys or strings): 8-byte values by
    ``WordLookup``, any other by ``DictionaryLookup`` over the dictionary's values of other lengths (usually none)."""

    def __init__(self, dictionary):
        from .dictionaries import DictionaryLookup
        import polars as pl
        self.words = WordLookup(dictionary)
        self.text = DictionaryLookup(dictionary.filter(pl.col("value").str.len_bytes() != 8))

    def ids(self, values) -> np.ndarray:
        import polars as pl
        if _is_words(values):
            return self.words.ids(values)
        if not isinstance(values, pl.Series):
            values = pl.from_arrow(values).cast(pl.Utf8)
        out = self.text.ids(values)
        rows, keys = text_to_words(values)
        out[rows] = self.words.ids(keys)
        return out


def _encode_columns(frame) -> List[Any]:
    """Futures of ``(codes, distinct values)`` of the 26 categorical columns, on the encoding threads. A column
    whose present values are all 8 bytes long (the reinterpretation as uint64 has exactly the text's nulls: both
    null counts are metadata, no extra pass) goes through ``_encode_words``; any other, through ``_encode``."""
    import polars as pl
    cats = _NAMES[1 + NUM_NUMERICAL:]
    words = frame.select([pl.col(n).cast(pl.Binary).bin.reinterpret(dtype=pl.UInt64, endianness="big")
                          for n in cats])
    futures = []
    for n in cats:
        if words[n].null_count() == frame[n].null_count():
            futures.append(_pool().submit(lambda name: _encode_words(words[name].to_arrow()), n))
        else:
            futures.append(_pool().submit(lambda name: _encode(frame[name].to_arrow()), n))
    return futures


_POOL = None


def _pool():
    global _POOL
    if _POOL is None:
            _POOL = ThreadPoolExecutor(max(1, min(4, os.cpu_count() or 1)), thread_name_prefix="criteo-encode")
    return _POOL


_MISSING_INT = np.iinfo(np.int64).min
_LOG_TABLE_SIZE = 1 << 16
_LOG_TABLE: Optional[np.ndarray] = None


def _spark_log(x: np.ndarray) -> np.ndarray:
    """Spark's numerical transform of integers > -3: ``log(double(x) + 3)`` cast to float, stored as float16."""
    return np.log(x.astype(np.float64) + 3.0).astype(np.float32).astype(np.float16)


def log_numerical(numbers: np.ndarray, present: np.ndarray) -> np.ndarray:
    """float16 [n, 13] of int64 ``numbers`` [n, 13]: ``_spark_log`` where present and > -3, else 0 (Spark's NULL).
    Criteo's integers are mostly small counts: those below 2**16 - 3 are looked up in a table of ``_spark_log``
    (the same float16 values, computed once) instead of taking a logarithm each; larger ones are computed."""
    index = np.where(present & (numbers > -3), numbers + 3, 0)
    large = index >= _LOG_TABLE_SIZE
    out = _log_table()[np.minimum(index, _LOG_TABLE_SIZE - 1)]
    if large.any():
        out[large] = _spark_log(numbers[large])
    return out


def _log_table() -> np.ndarray:
    global _LOG_TABLE
    if _LOG_TABLE is None:
        table = np.zeros(_LOG_TABLE_SIZE, dtype=np.float16)          # index x + 3; 0 is x = -3, Spark's NULL
        table[1:] = _spark_log(np.arange(1, _LOG_TABLE_SIZE, dtype=np.int64) - 3)
        _LOG_TABLE = table
    return _LOG_TABLE


def _typed_numbers(frame) -> Tuple[np.ndarray, np.ndarray]:
    """``log_numerical`` for a frame of ``_read_typed``, the index into the table computed by Polars (in parallel,
    2 bytes a value instead of int64 values and masks in NumPy). Returns (label int64 [n], ``_MISSING_INT`` where
    missing; numerical float16 [n, 13])."""
    import polars as pl
    label = frame["label"].fill_null(_MISSING_INT).to_numpy()
    names = _INT_COLUMNS[1:]
    top = _LOG_TABLE_SIZE - 1
    # null > -3 is null, which `when` takes as false: missing -> index 0 (Spark's NULL), as x <= -3
    index = frame.select([pl.when(pl.col(n) > -3).then(pl.min_horizontal(pl.col(n) + 3, top)).otherwise(0)
                          .cast(pl.UInt16).alias(n) for n in names]).to_numpy()
    numerical = _log_table()[index]
    largest = frame.select([pl.col(n).max() for n in names]).row(0)
    for j, value in enumerate(largest):
        if value is not None and value + 3 > top:      # beyond the table: computed (rare in Criteo)
            column = frame[names[j]].fill_null(0).to_numpy()
            rows = np.flatnonzero(column > top - 3)
            numerical[rows, j] = _spark_log(column[rows])
    return label, numerical


def _read_chunk_frame(data: bytes, n_lines: int, sep: str):
    """(typed, frame, kept, structural, padded_lines, starts, ends) of one chunk's text: the frame read typed when
    every line is well formed (``typed`` is that frame, else None and every field is text), the lines kept in
    it, each line's structural reason (-1: none; empty or too many fields), which lines had fewer than 40
    fields, and the line offsets when they were needed (else None)."""
    structural = np.full(n_lines, -1, dtype=np.int16)       # reason index of empty / too-long lines
    padded_lines = np.zeros(n_lines, dtype=bool)
    kept = np.arange(n_lines)
    starts = ends = None
    frame = None
    typed = _read_typed(data, sep)
    if typed is None:
        # Count the fields of every line (lines with more than 40 are malformed and left out), read the text.
        starts, ends = _line_offsets(data)
        fields = _fields_per_line(data, sep, ends)
        padded_lines = fields < NUM_FIELDS
        structural[(fields > NUM_FIELDS) & (ends != starts)] = _REASONS.index(REASON_TOO_MANY_FIELDS)
        if (structural >= 0).any():
            keep = structural < 0
            kept = np.flatnonzero(keep)
            frame = _read_frame(np.frombuffer(data, np.uint8)[np.repeat(keep, ends - starts + 1)].tobytes(), sep)
        else:
            frame = _read_frame(data, sep)
    else:
        frame = typed
        if count_byte(data, ord(sep)) != (NUM_FIELDS - 1) * n_lines:
            # Some lines have fewer than 40 fields (none has more: the reader would have raised). Only a row whose
            # last field is empty can be one: count the separators of those lines alone.
            candidate = np.flatnonzero(frame[_NAMES[-1]].is_null().to_numpy())
            if len(candidate):
                starts, ends = _line_offsets(data)
                padded_lines[candidate] = _fields_of_candidates(data, sep, frame, candidate, starts,
                                                                ends) < NUM_FIELDS
    return typed, frame, kept, structural, padded_lines, starts, ends


def parse_chunk(chunk: RawChunk, fmt: FileFormat, examples: int = 0) -> ParsedChunk:
    """Parse one chunk with the Spark job's row rules; ``examples``: how many malformed lines to quote."""
    data, n_lines, sep = chunk.data, chunk.num_lines, fmt.delimiter
    typed, frame, kept, structural, padded_lines, starts, ends = _read_chunk_frame(data, n_lines, sep)
    if frame.height != len(kept):
        raise CriteoPreprocessError(f"internal: parsed {frame.height} rows from {len(kept)} lines")
    n = len(kept)
    reason = np.full(n, -1, dtype=np.int16)
    if chunk.bom_line and n and kept[0] == 0:
        reason[0] = _REASONS.index(REASON_BAD_LABEL)     # Spark reads the mark as part of the label
    futures = _encode_columns(frame)
    numerical = None
    if typed is None:
        values, present, bad = _integers(frame)
        label, label_present = values[:, 0], present[:, 0]
        bad_label = ~label_present | bad[:, 0] | ((label != 0) & (label != 1))
    else:
        # A missing label becomes a number no field can hold (the reader kept |x| < 10**18).
        label, numerical = _typed_numbers(frame)
        label_present = label != _MISSING_INT
        bad_label = (label != 0) & (label != 1)
    reason[(reason < 0) & bad_label] = _REASONS.index(REASON_BAD_LABEL)
    if typed is None:
        for i in range(NUM_NUMERICAL):
            reason[(reason < 0) & bad[:, 1 + i]] = _REASONS.index(REASON_BAD_NUMERICAL.format(i + 1))
    if bad_label.any():
        # A row without a label is an empty line or a line whose first field is empty: look at the text.
        starts, ends = (starts, ends) if starts is not None else _line_offsets(data)
        unlabeled = np.flatnonzero(~label_present)
        empty = ends[kept[unlabeled]] == starts[kept[unlabeled]]
        reason[unlabeled[empty]] = _REASONS.index(REASON_EMPTY_LINE)
    good = reason < 0
    structural_lines = np.flatnonzero(structural >= 0)
    malformed_lines = np.concatenate([structural_lines, kept[~good]])
    malformed_reasons = np.concatenate([structural[structural_lines], reason[~good]])
    order = np.argsort(malformed_lines, kind="stable")
    malformed_lines, malformed_reasons = malformed_lines[order], malformed_reasons[order]
    texts: Dict[int, Tuple[str, str]] = {}
    if examples and len(malformed_lines):
        starts, ends = (starts, ends) if starts is not None else _line_offsets(data)
        for line, why in zip(malformed_lines[:examples].tolist(), malformed_reasons[:examples].tolist()):
            texts[line + chunk.first_line] = (_REASONS[why], ("\ufeff" if chunk.bom_line and line == 0 else "")
                                              + _line_text(data, starts, ends, line))
    encoded = [f.result() for f in futures]
    all_good = bool(good.all())
    if numerical is None:
        values, present = (values, present) if all_good else (values[good], present[good])
        # Spark: log(double(x) + 3) cast to float (NULL, hence 0, for missing and x <= -3); the binary holds float16.
        numerical = log_numerical(values[:, 1:], present[:, 1:])
    elif not all_good:
        numerical = numerical[good]
    label = label if all_good else label[good]
    codes = np.empty((NUM_CATEGORICAL, len(label)), dtype=np.uint32)
    uniques = []
    for c, (column_codes, dictionary) in enumerate(encoded):
        codes[c] = column_codes if all_good else column_codes[good]
        uniques.append(dictionary)
    return ParsedChunk(n_lines, label.astype(np.int8), numerical, codes, uniques,
                       kept[good].astype(np.int64) + chunk.first_line, padded_lines[kept[good]],
                       malformed_lines + chunk.first_line, malformed_reasons, texts)


# ----------------------------------------------------------------------------------------------------- progress
class Progress:
    """Prints ``done of total``, rate and time left at most every ``interval`` seconds."""

    def __init__(self, name: str, total: float, unit: str, interval: float = 5.0):
        self.name, self.total, self.unit, self.interval = name, max(float(total), 1.0), unit, interval
        self.started = self.last = time.time()
        self.done = 0.0
        self.rows = 0

    def update(self, done: float, rows: int = 0, what: str = "", force: bool = False) -> None:
        self.done, self.rows = done, self.rows + rows
        now = time.time()
        if not force and now - self.last < self.interval:
            return
        self.last = now
        elapsed = max(now - self.started, 1e-9)
        fraction = min(self.done / self.total, 1.0)
        left = elapsed * (1 - fraction) / fraction if fraction > 0 else float("inf")
        amount = (f"{self.done / 2**20:,.0f} of {self.total / 2**20:,.0f} MiB" if self.unit == "bytes"
                  else f"{self.done:,.0f} of {self.total:,.0f} {self.unit}")
        print(f"[criteo] {self.name}: {amount} ({fraction:.0%}), {self.rows:,} rows, {self.rows / elapsed:,.0f} "
              f"rows/s, {hms(left)} left{(' ' + what) if what else ''}", flush=True)


def _peak_rss_note() -> str:
    import resource
    return f"peak RSS so far {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:,.0f} MiB"


# ----------------------------------------------------------------------------------------------------- work state
class WorkState:
    """``<work>/state.json``: what is finished, written atomically after each step."""

    def __init__(self, work: str, fingerprint: Dict[str, Any]):
        self.path = os.path.join(work, "state.json")
        self.data: Dict[str, Any] = {"version": _STATE_VERSION, "fingerprint": fingerprint, "files": {},
                                     "pass2": {}, "buckets": {}}
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8") as f:
                old = json.load(f)
            if old.get("version") != _STATE_VERSION or old.get("fingerprint") != fingerprint:
                raise CriteoPreprocessError(
                    f"{work}: holds an unfinished run with other input files or arguments; run with those again to "
                    f"resume it, or pass --restart (or delete that directory) to start over")
            self.data = old

    def save(self) -> None:
        atomic_write_text(self.path, json.dumps(self.data, indent=1) + "\n")


def _fingerprint(args: argparse.Namespace, files: List[str]) -> Dict[str, Any]:
    keep = ("layout", "header", "delimiter", "frequency_limit", "dictionary_source", "train_ordering", "seed",
            "chunk_mb", "shuffle_memory_mb", "shuffle_bucket_rows")
    return {"files": [os.path.basename(p) for p in files], **{k: getattr(args, k) for k in keep}}


def _file_stat(path: str) -> List[int]:
    st = os.stat(path)
    return [st.st_size, st.st_mtime_ns]


def _forget_changed_files(state: WorkState, files: List[str]) -> None:
    """A file replaced since its pass 1 (e.g. a re-downloaded day) is parsed again; pass 2 then starts over, as the
    dictionaries may change."""
    changed = [os.path.basename(p) for p in files
               if state.data["files"].get(os.path.basename(p), {}).get("stat", _file_stat(p)) != _file_stat(p)]
    for name in changed:
        print(f"[criteo] {name} changed since the interrupted run: parsing it again", flush=True)
        del state.data["files"][name]
    if changed:
        for key in ("pass2", "buckets"):
            state.data[key] = {}
        for key in ("pass2_sizes", "bucket_sizes", "train_written"):
            state.data.pop(key, None)
        state.save()


# ----------------------------------------------------------------------------------------------------- chunk files
_CHUNK_ARRAYS = ("label", "numerical", "codes", "lines", "padded")


def _is_words(values) -> bool:
    return isinstance(values, np.ndarray)


def _save_chunk(directory: str, k: int, parsed: ParsedChunk) -> None:
    """``chunk_<k>.*``: the arrays, the 8-byte columns' distinct values as one uint64 array (``words.npy``), the
    others' as one string column (``.arrow``), and per column how many and of which kind (``lengths.npy``)."""
    import pyarrow as pa
    import pyarrow.feather as feather
    for name in _CHUNK_ARRAYS:
        np.save(os.path.join(directory, f"chunk_{k}.tmp.{name}.npy"), getattr(parsed, name))
    lengths = np.array([[0 if u is None else len(u), _is_words(u)] for u in parsed.uniques], dtype=np.int64)
    text = [u.cast(pa.large_string()) for u in parsed.uniques if u is not None and not _is_words(u)]
    values = pa.concat_arrays(text) if text else pa.array([], pa.large_string())
    feather.write_feather(pa.table({"value": values}), os.path.join(directory, f"chunk_{k}.tmp.arrow"),
                          compression="uncompressed")
    words = [u for u in parsed.uniques if _is_words(u)]
    np.save(os.path.join(directory, f"chunk_{k}.tmp.words.npy"),
            np.concatenate(words) if words else np.zeros(0, np.uint64))
    np.save(os.path.join(directory, f"chunk_{k}.tmp.lengths.npy"), lengths)
    for suffix in ("arrow", "words.npy", "lengths.npy") + tuple(f"{name}.npy" for name in _CHUNK_ARRAYS):
        os.replace(os.path.join(directory, f"chunk_{k}.tmp.{suffix}"), os.path.join(directory, f"chunk_{k}.{suffix}"))


def _load_chunk(directory: str, k: int):
    import polars as pl
    import pyarrow.feather as feather
    arrays = {name: np.load(os.path.join(directory, f"chunk_{k}.{name}.npy")) for name in _CHUNK_ARRAYS}
    lengths = np.load(os.path.join(directory, f"chunk_{k}.lengths.npy"))
    values = pl.from_arrow(feather.read_table(os.path.join(directory, f"chunk_{k}.arrow"))["value"])
    words = np.load(os.path.join(directory, f"chunk_{k}.words.npy"))
    uniques, at_text, at_words = [], 0, 0
    for length, is_words in lengths.tolist():
        if is_words:
            uniques.append(words[at_words:at_words + length])
            at_words += length
        else:
            uniques.append(values.slice(at_text, length).cast(pl.Utf8))
            at_text += length
    return arrays, uniques


# ----------------------------------------------------------------------------------------------------- output files
class SplitBinaryAppender:
    """Appends blocks to the split-binary files of one mapping (``label.bin``, ``numerical.bin``, ``cat_<i>.bin``, in
    the dtypes of ``spec``), each under ``directory``; ``sizes()`` / ``truncate(sizes)`` let a resumed run cut the
    files back to the end of the last finished step."""

    def __init__(self, spec, mapping: str, directory: str):
        self.paths = {}
        self.dtypes = {}
        for chunk in spec.source_spec[mapping]:
            name = chunk["files"][0]
            self.paths[tuple(chunk["features"])] = os.path.join(directory, name)
            self.dtypes[tuple(chunk["features"])] = spec.numpy_dtype(chunk["features"][0])
        for path in self.paths.values():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if not os.path.exists(path):
                open(path, "wb").close()

    def sizes(self) -> Dict[str, int]:
        return {p: os.path.getsize(p) for p in self.paths.values()}

    def truncate(self, sizes: Dict[str, int]) -> None:
        for path in self.paths.values():
            os.truncate(path, sizes.get(path, 0))

    def append(self, label: np.ndarray, numerical: np.ndarray, ids: np.ndarray) -> None:
        """``label`` [n], ``numerical`` float16 [n, 13], ``ids`` [26, n] (any integer dtype)."""
        for features, path in self.paths.items():
            dtype = self.dtypes[features]
            if features[0] == "label":
                block = label.astype(np.bool_)
            elif features[0].startswith("num_"):
                block = np.ascontiguousarray(numerical, dtype=np.float16)
            else:
                block = ids[int(features[0][4:-4])].astype(dtype)
            with open(path, "ab") as f:
                f.write(block.tobytes())


# ----------------------------------------------------------------------------------------------------- the run
def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="python -m recsys_common.criteo.polars_preprocess",
        description="Criteo raw TSV or a CSV copy (Terabyte day_0..day_23 or Kaggle train.txt) -> split-binary "
                    "dataset with feature_spec.yaml, on one machine (Polars).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--input_path", default=env("INPUT_PATH"), required=env("INPUT_PATH") is None,
                        help="directory with day_0 .. day_23 (Terabyte) or train.txt (Kaggle), or train.txt itself "
                             "[env INPUT_PATH]")
    parser.add_argument("--output_path", default=env("BINARY_PATH"), required=env("BINARY_PATH") is None,
                        help="split-binary dataset directory: {train,test,validation}/*.bin, feature_spec.yaml, "
                             "preprocess_report.json [env BINARY_PATH]")
    parser.add_argument("--work_dir", default=None,
                        help="scratch directory for the intermediate files and the resume state (about the size of "
                             "the output, plus as much again for the train shuffle); default OUTPUT_PATH.work")
    parser.add_argument("--layout", choices=("auto", "terabyte", "kaggle"), default="auto", help="as spark_preprocess")
    parser.add_argument("--header", choices=HEADER_CHOICES, default="auto", help="as spark_preprocess")
    parser.add_argument("--delimiter", choices=DELIMITER_CHOICES, default="auto", help="as spark_preprocess")
    parser.add_argument("--frequency_limit", type=int, default=int(env("FREQUENCY_LIMIT", DEFAULT_FREQUENCY_LIMIT)),
                        help="categorical values seen fewer times map to the rare id 1 [env FREQUENCY_LIMIT]")
    parser.add_argument("--dictionary_source", choices=("all", "train"), default="all", help="as spark_preprocess")
    parser.add_argument("--train_ordering", choices=("random", "input"), default="random",
                        help="row order of the train split: shuffled with --seed, or the input's order")
    parser.add_argument("--seed", type=int, default=12345, help="seed of the train shuffle")
    parser.add_argument("--max_malformed_fraction", type=float, default=0.01,
                        help="fail when more than this fraction of the rows is malformed")
    parser.add_argument("--max_examples", type=int, default=20, help="malformed rows quoted in the report")
    parser.add_argument("--chunk_mb", type=int, default=32, help="MiB of raw text parsed at a time (memory)")
    parser.add_argument("--hold_input_mb", type=int, default=512,
                        help="an input of at most this many MiB of text (.gz files count 4x their size) keeps its "
                             "parsed chunks in memory from pass 1 to pass 2 (about 0.6x the text) instead of "
                             "writing them to the work directory; a killed run then starts over. 0: always write "
                             "them (a killed run resumes after its last finished file)")
    parser.add_argument("--shuffle_memory_mb", type=int, default=256,
                        help="MiB a train shuffle bucket may take in memory: sets the rows per bucket, so that peak "
                             "memory does not grow with the number of rows")
    parser.add_argument("--shuffle_bucket_rows", type=int, default=None,
                        help="train rows per shuffle bucket (each bucket is permuted in memory); default: from "
                             "--shuffle_memory_mb")
    parser.add_argument("--overwrite", action="store_true",
                        help="write into a non-empty --output_path, replacing this tool's (or the Spark path's "
                             "conversion's) own earlier outputs there; other files are kept")
    parser.add_argument("--restart", action="store_true",
                        help="discard an unfinished run's work directory instead of resuming it")
    return parser


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.frequency_limit < 0:
        parser.error(f"--frequency_limit must be >= 0, got {args.frequency_limit}")
    if not 0.0 <= args.max_malformed_fraction <= 1.0:
        parser.error(f"--max_malformed_fraction must be in [0, 1], got {args.max_malformed_fraction}")
    if args.chunk_mb < 1 or args.shuffle_memory_mb < 1 or (args.shuffle_bucket_rows is not None
                                                            and args.shuffle_bucket_rows < 1):
        parser.error("--chunk_mb, --shuffle_memory_mb and --shuffle_bucket_rows must be >= 1")
    if args.hold_input_mb < 0:
        parser.error(f"--hold_input_mb must be >= 0, got {args.hold_input_mb}")
    args.work_dir = args.work_dir or os.path.abspath(args.output_path).rstrip(os.sep) + ".work"
    return args


_WORK_MARK = ".criteo_polars_work"


def _prepare_work_dir(work: str, restart: bool) -> None:
    """Create the work directory, or reuse one this tool made; never touch a directory it did not make."""
    mark = os.path.join(work, _WORK_MARK)
    if os.path.isdir(work) and os.listdir(work) and not os.path.exists(mark):
        raise CriteoPreprocessError(f"{work}: --work_dir exists and was not made by this tool; choose another")
    if restart and os.path.exists(mark):
        shutil.rmtree(work)
    os.makedirs(work, exist_ok=True)
    open(mark, "a").close()


def _split_of_lines(lines: np.ndarray, is_split_file: bool, bounds: Optional[Tuple[int, int]]) -> np.ndarray:
    """0 train, 1 test, 2 validation per data line."""
    if not is_split_file:
        return np.zeros(len(lines), dtype=np.int8)
    train_end, test_end = bounds
    return (lines >= train_end).astype(np.int8) + (lines >= test_end).astype(np.int8)


def _count_lines(path: str, fmt: FileFormat, chunk_bytes: int) -> int:
    return sum(c.num_lines for c in iter_line_chunks(path, fmt, chunk_bytes))


def count_pass(args, layout: InputLayout, formats: Dict[str, FileFormat], state: WorkState, work: str,
               bounds: Optional[Tuple[int, int]], held: Optional[Dict[str, Any]] = None) -> None:
    """Pass 1: parse every file once, keep the chunks (in ``held`` when given, else in chunk files), count values
    per file."""
    import polars as pl
    files = list(layout.train_files) + [layout.split_file]
    total = sum(os.path.getsize(p) for p in files)
    done_bytes = sum(os.path.getsize(p) for p in files if state.data["files"].get(os.path.basename(p)))
    resumed: List[str] = []
    progress = Progress("pass 1/2 (parse and count)", total, "bytes")
    progress.update(done_bytes, 0, force=True)
    for index, path in enumerate(files):
        name = os.path.basename(path)
        if state.data["files"].get(name):
            resumed.append(name)
            continue
        directory = os.path.join(work, "files", str(index))
        if os.path.isdir(directory):
            shutil.rmtree(directory)   # this tool's partial files of a killed run
        os.makedirs(directory)
        is_split = index == len(files) - 1
        counted_frames: List[List[Any]] = [[] for _ in range(NUM_CATEGORICAL)]
        lines = good = 0
        padded = 0
        mal_lines, mal_reasons, examples = [], [], {}
        k = 0
        # The next chunk is read (and decompressed) on a thread while this one is parsed.
        chunks = prefetched(iter_line_chunks(path, formats[path], args.chunk_mb << 20), name="criteo-read")
        for chunk, parsed, counts in ordered_parallel(
                lambda item: _parse_save_count(item[1], formats[path], item[0], directory, args.dictionary_source,
                                               is_split, bounds, max(0, args.max_examples - len(examples)), held),
                enumerate(chunks), workers=_parse_workers()):
            for c, frame in enumerate(counts):
                if frame is not None:
                    counted_frames[c].append(frame)
                if len(counted_frames[c]) > _MERGE_EVERY:
                    # Fold the chunks' counts as we go: memory is the file's distinct values, not its chunks'.
                    counted_frames[c] = _merge_key_counts(counted_frames[c])
            lines += parsed.num_lines
            good += len(parsed.label)
            padded += int(parsed.padded.sum())
            mal_lines.append(parsed.malformed_lines)
            mal_reasons.append(parsed.malformed_reasons)
            examples.update(parsed.malformed_text)
            k += 1
            progress.update(done_bytes + chunk.position, parsed.num_lines, what=f"({name})")
        frames = []
        for c in range(NUM_CATEGORICAL):
            merged = _file_counts(counted_frames[c])
            frames.append(merged.with_columns(pl.lit(c, dtype=pl.Int8).alias("column")))
        counted_frames = None
        tmp = os.path.join(directory, "counts.tmp.parquet")
        pl.concat(frames).select("column", "value", "count").write_parquet(tmp, compression="lz4")
        os.replace(tmp, os.path.join(directory, "counts.parquet"))
        np.savez(os.path.join(directory, "malformed.npz"),
                 lines=np.concatenate(mal_lines) if mal_lines else np.zeros(0, np.int64),
                 reasons=np.concatenate(mal_reasons) if mal_reasons else np.zeros(0, np.int16))
        header = 1 if formats[path].header else 0
        if lines == 0:
            raise CriteoInputError(f"{path}: no data lines (an empty day file is an incomplete download; delete "
                                   f"or replace it)")
        state.data["files"][name] = {"index": index, "stat": _file_stat(path), "chunks": k, "lines": lines, "good": good, "padded": padded,
                                     "examples": [{"file": name, "data_line": line, "line": line + header + 1,
                                                   "reason": why, "text": text}
                                                  for line, (why, text) in sorted(examples.items())]}
        state.save()
        _maybe_killed("count", index + 1)
        done_bytes += os.path.getsize(path)
    progress.update(done_bytes, 0, force=True)
    if resumed:
        print(f"[criteo] resumed: pass 1 skipped {len(resumed)} finished file(s): {', '.join(resumed)}", flush=True)
    return resumed


_MERGE_EVERY = 16   # chunks' counts held per column before they are summed into one frame


def _parse_save_count(chunk: RawChunk, fmt: FileFormat, k: int, directory: str, dictionary_source: str,
                      is_split: bool, bounds, examples: int, held: Optional[Dict[str, Any]] = None):
    """Pass 1 for one chunk, on a worker thread: parse, save ``chunk_<k>.*``, count each column's values (of the
    train lines only with ``--dictionary_source train``). Returns (chunk, parsed, per column a ``value, count``
    frame or None)."""
    import polars as pl
    parsed = parse_chunk(chunk, fmt, examples)
    if held is None:
        _save_chunk(directory, k, parsed)
    else:
        held[(directory, k)] = ({name: getattr(parsed, name) for name in _CHUNK_ARRAYS}, parsed.uniques)
    counted = None if dictionary_source == "all" else _split_of_lines(parsed.lines, is_split, bounds) == 0
    counts: List[Any] = []
    for c in range(NUM_CATEGORICAL):
        values = parsed.uniques[c]
        if values is None or not len(values):
            counts.append(None)
            continue
        codes = parsed.codes[c] if counted is None else parsed.codes[c, counted]
        n = np.bincount(codes, minlength=len(values) + 1)[1:].astype(np.uint64)
        seen = n > 0     # a value of malformed (or, with --dictionary_source train, other splits') rows only
        if not seen.all():
            keep = np.flatnonzero(seen)
            values = values[keep] if _is_words(values) else values.take(keep)
            n = n[keep]
        # 8-byte values are counted as uint64 keys ("key"), others as strings ("value"); count_pass turns the keys
        # into strings once per file.
        counts.append(pl.DataFrame({"key": values, "count": n}) if _is_words(values) else
                      pl.DataFrame({"value": pl.from_arrow(values).cast(pl.Utf8), "count": n}))
    chunk.data = b""       # the text is no longer needed while the result waits for its turn
    return chunk, parsed, counts


def _merge_key_counts(frames: List[Any]):
    """``merge_counts`` for frames of either kind (``key`` uint64 or ``value`` string), same kinds summed together:
    at most one frame of each kind comes back."""
    import polars as pl
    out = []
    for kind in ("key", "value"):
        same = [f for f in frames if f.columns[0] == kind and f.height]
        if len(same) == 1:
            out.append(same[0])
        elif same:
            out.append(pl.concat(same).group_by(kind).agg(pl.col("count").sum()))
    return out


def _file_counts(frames: List[Any]):
    """One column's counts of a file as ``value, count`` (strings): the keys' turned into their strings."""
    from .dictionaries import merge_counts
    import polars as pl
    merged = _merge_key_counts(frames)
    text = [f if f.columns[0] == "value" else
            pl.DataFrame({"value": words_to_text(f["key"].to_numpy()), "count": f["count"]}) for f in merged]
    return text[0] if len(text) == 1 else merge_counts(text)


def _parse_workers() -> int:
    # Two chunks in flight keep both cores busy: one chunk's NumPy / Python steps overlap the other's Polars and
    # Arrow steps (which release the GIL). More only add memory.
    return max(1, min(2, os.cpu_count() or 1))


def ordered_parallel(function, items, workers: int = 2):
    """``map(function, items)`` on ``workers`` threads, results in order, at most ``workers`` items in flight (memory
    stays that of ``workers`` items); an exception is raised here when its item's turn comes."""
    if workers <= 1:
        for item in items:
            yield function(item)
        return
    pending: "deque" = deque()
    # One pool for the whole run, not one per file: allocators keep memory per thread (Polars' and Arrow's jemalloc
    # arenas), so fresh threads for every day file made the peak grow with the number of files (943 MiB for 8 day
    # files against 675 MiB for one Kaggle file).
    pool = _PARSE_POOLS.get(workers)
    if pool is None:
        pool = _PARSE_POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="criteo-parse")
    try:
        for item in items:
            pending.append(pool.submit(function, item))
            if len(pending) >= workers:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for future in pending:
            future.cancel()
        for future in pending:   # a cancelled run leaves no worker still writing into its directory
            if not future.cancelled():
                try:
                    future.result()
                except BaseException:
                    pass


_PARSE_POOLS: Dict[int, Any] = {}


def build_all_dictionaries(work: str, num_files: int, frequency_limit: int):
    """Sum the per-file counts (lazily, column by column) and build the 26 dictionaries."""
    import polars as pl
    from .dictionaries import build_dictionary
    paths = [os.path.join(work, "files", str(i), "counts.parquet") for i in range(num_files)]
    scan = pl.scan_parquet(paths)
    dictionaries = []
    for c in range(NUM_CATEGORICAL):
        counts = (scan.filter(pl.col("column") == c).group_by("value").agg(pl.col("count").sum())
                  .collect(engine="streaming"))
        dictionaries.append(build_dictionary(counts, frequency_limit))
    return dictionaries


def _holds_input(files: List[str], hold_input_mb: int) -> bool:
    """Whether the parsed chunks stay in memory between the passes: the input's text is at most ``hold_input_mb``
    (a ``.gz`` file counted at 4x its size, about Criteo's compression ratio). They take about 0.6x the text."""
    text = sum(os.path.getsize(p) * (4 if p.endswith(".gz") else 1) for p in files)
    return text <= hold_input_mb << 20


def _forget_held_run(state: WorkState) -> None:
    """An interrupted run that held its parsed chunks in memory left nothing to resume from but its state: start
    over (such an input is at most --hold_input_mb of text, seconds of work)."""
    if state.data.get("held") and (state.data["files"] or state.data["pass2"] or state.data["buckets"]):
        print("[criteo] the interrupted run held its parsed chunks in memory (--hold_input_mb): starting over",
              flush=True)
        for key in ("files", "pass2", "buckets"):
            state.data[key] = {}
        for key in ("pass2_sizes", "bucket_sizes", "train_written"):
            state.data.pop(key, None)
        state.save()


@dataclass
class _Run:
    """One run's inputs and work state, settled by :func:`_open_run` and handed to each step of :func:`run`."""
    args: argparse.Namespace
    layout: InputLayout
    files: List[str]
    formats: Dict[str, FileFormat]
    state: WorkState
    held: Optional[Dict[Any, Any]]   # parsed chunks kept in memory from pass 1 to pass 2 (None: on disk)
    started: float

    @property
    def work(self) -> str:
        return self.args.work_dir


def _open_run(args: argparse.Namespace) -> _Run:
    """Check the input and the output directory, open (or resume) the work directory."""
    started = time.time()
    layout = discover_input(args.input_path, args.layout)
    files = list(layout.train_files) + [layout.split_file]
    formats = {p: sniff_format(p, args.header, args.delimiter) for p in files}
    for path in files:
        if os.path.getsize(path) == 0:
            raise CriteoInputError(f"{path}: empty file (an incomplete download?); delete or replace it")
    check_output_directory(args.output_path, args.overwrite)
    _prepare_work_dir(args.work_dir, args.restart)
    state = WorkState(args.work_dir, _fingerprint(args, files))
    _forget_changed_files(state, files)
    _forget_held_run(state)
    # Small inputs keep their parsed chunks in memory from pass 1 to pass 2 (no chunk files written and read back);
    # larger ones write them to the work directory, so that a killed run resumes without parsing finished files again.
    held: Optional[Dict[Any, Any]] = {} if _holds_input(files, args.hold_input_mb) else None
    if bool(state.data.get("held")) != (held is not None):
        state.data["held"] = held is not None
        state.save()
    if held is not None and _TUNE_ALLOCATORS:
        tune_allocators()   # before Polars is imported (in count_pass)
    print(f"[criteo] {layout.kind} layout: {len(layout.train_files)} train file(s) + split file "
          f"{os.path.basename(layout.split_file)}; work directory {args.work_dir}", flush=True)
    return _Run(args, layout, files, formats, state, held, started)


def _count(r: _Run) -> List[str]:
    """Pass 1 (:func:`count_pass`); returns the files it resumed rather than read again."""
    bounds = None
    if r.args.dictionary_source == "train" and r.layout.kind == "kaggle":
        # The train lines of the split file are counted for the dictionaries: their number must be known first.
        if "split_lines" not in r.state.data:
            r.state.data["split_lines"] = _count_lines(r.layout.split_file, r.formats[r.layout.split_file],
                                                       r.args.chunk_mb << 20)
            r.state.save()
        bounds = split_boundaries(r.layout.kind, r.state.data["split_lines"])
    return count_pass(r.args, r.layout, r.formats, r.state, r.work, bounds, r.held)


def _rows_by_split(r: _Run, info: Dict[str, Any], bounds: Tuple[int, int]):
    """(rows read per split, malformed rows per split and reason), from pass 1's per-file records."""
    rows_read = {s: 0 for s in SPLITS}
    malformed: Dict[str, Dict[str, int]] = {s: {} for s in SPLITS}
    for index, path in enumerate(r.files):
        name = os.path.basename(path)
        mal = np.load(os.path.join(r.work, "files", str(index), "malformed.npz"))
        is_split = index == len(r.files) - 1
        if is_split:
            line_split = _split_of_lines(np.arange(info[name]["lines"]), is_split, bounds)
            for s, split in enumerate(SPLITS):
                rows_read[split] += int((line_split == s).sum())
        else:
            rows_read["train"] += info[name]["lines"]
        splits_of_bad = _split_of_lines(mal["lines"], is_split, bounds)
        for reason, s in zip(mal["reasons"].tolist(), splits_of_bad.tolist()):
            key = _REASONS[reason]
            malformed[SPLITS[s]][key] = malformed[SPLITS[s]].get(key, 0) + 1
    return rows_read, malformed


def _input_report(r: _Run, resumed: List[str]) -> Tuple[Dict[str, Any], Dict[str, Any], Tuple[int, int]]:
    """(report, per-file records, split bounds): rows per split, malformed rows per reason and split (refused
    beyond ``--max_malformed_fraction``). Padded rows are attributed in pass 2."""
    args = r.args
    info = {os.path.basename(p): r.state.data["files"][os.path.basename(p)] for p in r.files}
    split_name = os.path.basename(r.layout.split_file)
    num_lines = info[split_name]["lines"]
    bounds = split_boundaries(r.layout.kind, num_lines)
    report: Dict[str, Any] = {
        "engine": "polars", "input": r.layout.describe(), "frequency_limit": args.frequency_limit,
        "dictionary_source": args.dictionary_source, "train_ordering": args.train_ordering, "seed": args.seed,
        "ids": {"missing": MISSING_ID, "rare_or_unseen": RARE_ID, "first_frequent": FIRST_FREQUENT_ID},
        "input_format": {os.path.basename(p): f.describe() for p, f in r.formats.items()},
        "split": {"lines_in_split_file": num_lines, "train_end_line": bounds[0], "test_end_line": bounds[1],
                  "split_file_header": bool(r.formats[r.layout.split_file].header)},
        "resumed": {"count": resumed, "write": []}}
    rows_read, malformed = _rows_by_split(r, info, bounds)
    report["rows_read"] = rows_read
    report["rows_malformed"] = malformed
    report["rows_written"] = {s: rows_read[s] - sum(malformed[s].values()) for s in SPLITS}
    examples = [e for p in r.files for e in info[os.path.basename(p)]["examples"]][:args.max_examples]
    if malformed_total(report):
        report["malformed_examples"] = [
            {"file": e["file"], "line": e["line"], "reason": e["reason"], "text": e["text"],
             "split": SPLITS[int(_split_of_lines(np.array([e["data_line"]]), e["file"] == split_name, bounds)[0])]}
            for e in examples]
    check_malformed(args.input_path, report, examples, args.max_malformed_fraction)
    return report, info, bounds


@dataclass
class _Outputs:
    """Where pass 2 writes: one appender per split; train rows go through bucket files (``scatter``, an external
    shuffle), or are held in memory and written once permuted (``train_rows``), or appended in order."""
    directory: str
    writers: Dict[str, "SplitBinaryAppender"]
    buckets: int
    scatter: bool
    train_rows: Optional["TrainRows"]


def _open_outputs(r: _Run, report: Dict[str, Any], cardinalities: List[int]) -> _Outputs:
    out_dir = os.path.join(r.work, "out")
    spec = FeatureSpec.get_default_feature_spec(NUM_NUMERICAL, cardinalities, mappings=SPLITS)
    writers = {s: SplitBinaryAppender(spec, s, out_dir) for s in SPLITS}
    random_order = r.args.train_ordering == "random"
    buckets = _bucket_count(report["rows_written"]["train"], bucket_rows(r.args))
    train_rows = None
    if random_order and buckets == 1 and not r.state.data.get("train_written"):
        if r.state.data["pass2"]:
            # The rows an interrupted run held in memory are gone: map every file again (pass 1 stays done).
            r.state.data["pass2"] = {}
            r.state.data.pop("pass2_sizes", None)
            r.state.save()
        train_rows = TrainRows(writers["train"], report["rows_written"]["train"])
    return _Outputs(out_dir, writers, buckets, random_order and buckets > 1, train_rows)


def _map_chunk(arrays: Dict[str, np.ndarray], uniques, lookups: List["ColumnLookup"]) -> np.ndarray:
    """The ids ``[26, n]`` (int32) of one parsed chunk's categorical codes, through the dictionaries."""
    codes = arrays["codes"]
    ids = np.empty(codes.shape, dtype=np.int32)       # [26, n]
    for c in range(NUM_CATEGORICAL):
        table = np.empty(len(uniques[c]) + 1, dtype=np.int32)
        table[0] = MISSING_ID
        table[1:] = lookups[c].ids(uniques[c])
        np.take(table, codes[c], out=ids[c], mode="clip")   # codes are in range; "clip" is not buffered
    return ids


def _write_chunk(r: _Run, out: _Outputs, arrays, ids: np.ndarray, edges: List[int], shuffle_dir: str, k: int,
                 index: int, file_padded: Dict[str, int]) -> None:
    """Append one mapped chunk's rows to their splits (``edges``: where each split's rows start and end)."""
    for s, split in enumerate(SPLITS):
        mask = slice(edges[s], edges[s + 1])
        if mask.stop <= mask.start:
            continue
        file_padded[split] += int(arrays["padded"][mask].sum())
        if split == "train" and out.scatter:
            _scatter(shuffle_dir, k, arrays["label"][mask], arrays["numerical"][mask], ids[:, mask],
                     r.args.seed, index, out.buckets)
        elif split == "train" and out.train_rows is not None:
            out.train_rows.append(arrays["label"][mask], arrays["numerical"][mask], ids[:, mask])
        else:
            out.writers[split].append(arrays["label"][mask], arrays["numerical"][mask], ids[:, mask])


def _write_file(r: _Run, out: _Outputs, index: int, info: Dict[str, Any], bounds: Tuple[int, int],
                lookups: List["ColumnLookup"], progress: "Progress", done_rows: int) -> Tuple[Dict[str, int], int]:
    """Pass 2 over one input file: map and write its chunks; returns its padded rows per split and the rows done."""
    name = os.path.basename(r.files[index])
    # Cut the outputs back to the end of the last finished file (a killed run may have appended more).
    sizes = r.state.data.get("pass2_sizes", {})
    for s in SPLITS:
        out.writers[s].truncate(sizes.get(s, {}))
    is_split = index == len(r.files) - 1
    directory = os.path.join(r.work, "files", str(index))
    file_padded = {s: 0 for s in SPLITS}
    shuffle_dir = os.path.join(r.work, "shuffle", str(index))
    if out.scatter:
        if os.path.isdir(shuffle_dir):
            shutil.rmtree(shuffle_dir)
        os.makedirs(shuffle_dir)
    for k in range(info[name]["chunks"]):
        # A file resumed from an earlier run's pass 1 (one with a smaller --hold_input_mb) has its chunks on disk.
        chunk = r.held.pop((directory, k), None) if r.held is not None else None
        arrays, uniques = chunk if chunk is not None else _load_chunk(directory, k)
        ids = _map_chunk(arrays, uniques, lookups)
        # A chunk's lines ascend, so each split is one range of its rows: slices (views), not masks (copies).
        rows = ids.shape[1]
        edges = [0, *np.searchsorted(arrays["lines"], bounds).tolist(), rows] if is_split else [0, rows, rows, rows]
        _write_chunk(r, out, arrays, ids, edges, shuffle_dir, k, index, file_padded)
        done_rows += rows
        progress.update(done_rows, rows, what=f"({name})")
    return file_padded, done_rows


def _write_pass(r: _Run, out: _Outputs, report: Dict[str, Any], info: Dict[str, Any], bounds: Tuple[int, int],
                lookups: List["ColumnLookup"]) -> Dict[str, int]:
    """Pass 2: every file mapped and written (a finished file of an interrupted run is skipped); padded rows."""
    progress = Progress("pass 2/2 (map and write)", sum(report["rows_written"].values()), "rows")
    padded = {s: 0 for s in SPLITS}
    done_rows = 0
    for index, path in enumerate(r.files):
        name = os.path.basename(path)
        entry = r.state.data["pass2"].get(name)
        if entry and entry.get("done"):
            file_padded = entry["padded"]
            done_rows += info[name]["good"]
            report["resumed"]["write"].append(name)
        else:
            file_padded, done_rows = _write_file(r, out, index, info, bounds, lookups, progress, done_rows)
            r.state.data["pass2"][name] = {"done": True, "padded": file_padded}
            r.state.data["pass2_sizes"] = {s: out.writers[s].sizes() for s in SPLITS}
            r.state.save()
            _maybe_killed("write", index + 1)
        for s in SPLITS:
            padded[s] += file_padded[s]
    progress.update(done_rows, 0, force=True)
    return padded


def _finish_train(r: _Run, out: _Outputs, info: Dict[str, Any], report: Dict[str, Any]) -> None:
    """The shuffled train split assembled (from buckets, or permuted in memory), then every split's row count
    checked against the report."""
    if out.scatter:
        _assemble_shuffle(r.work, r.files, info, r.state, out.writers["train"], r.args.seed, out.buckets,
                          report["rows_written"]["train"])
    elif out.train_rows is not None:
        out.train_rows.write_permuted(r.args.seed)
        out.train_rows = None
        r.state.data["train_written"] = True
        r.state.save()
    for s in SPLITS:
        rows = os.path.getsize(out.writers[s].paths[("label",)])
        if rows != report["rows_written"][s]:
            raise CriteoPreprocessError(f"internal: wrote {rows} {s} rows, expected {report['rows_written'][s]}")


def _save_dictionaries(work: str, dictionaries) -> None:
    """The dictionaries, already built and held, written to ``<work>/dictionaries/<i>.parquet`` (moved into the
    output by ``_publish``), so that raw values can be mapped later as in training. Written again on a resumed run
    (the dictionaries are rebuilt from the saved counts each time)."""
    from .dictionaries import DICTIONARY_DIRECTORY, save_dictionary
    directory = os.path.join(work, DICTIONARY_DIRECTORY)
    if os.path.isdir(directory):
        shutil.rmtree(directory)
    os.makedirs(directory)
    for i, dictionary in enumerate(dictionaries):
        save_dictionary(dictionary, os.path.join(directory, f"{i}.parquet"))


def _publish(r: _Run, out: _Outputs, report: Dict[str, Any], cardinalities: List[int]) -> None:
    """Everything lands in --output_path at once (the splits, the saved dictionaries and their rule, the report);
    feature_spec.yaml (the marker) last. The work directory goes."""
    from .dictionaries import DICTIONARY_DIRECTORY, save_criteo_rule
    args = r.args
    with atomic_directory(args.output_path, overwrite=args.overwrite, tool=TOOL, marker="feature_spec.yaml") as tmp:
        for s in SPLITS:
            os.replace(os.path.join(out.directory, s), os.path.join(tmp, s))
        saved = os.path.join(tmp, DICTIONARY_DIRECTORY)
        os.replace(os.path.join(r.work, DICTIONARY_DIRECTORY), saved)
        save_criteo_rule(saved, args.frequency_limit, args.dictionary_source)
        final = FeatureSpec.get_default_feature_spec(NUM_NUMERICAL, cardinalities, mappings=SPLITS,
                                                     base_directory=tmp)
        final.metadata = dataset_metadata(report, {s: report["rows_written"][s] for s in SPLITS})
        report["seconds"] = round(time.time() - r.started, 1)
        atomic_write_text(os.path.join(tmp, "preprocess_report.json"), json.dumps(report, indent=2) + "\n")
        final.to_yaml(os.path.join(tmp, "feature_spec.yaml"))
    shutil.rmtree(r.work)


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """The job: pass 1 (parse, count), dictionaries, pass 2 (map, write, shuffle), then the output at once."""
    r = _open_run(args)
    resumed = _count(r)
    report, info, bounds = _input_report(r, resumed)
    dictionaries = build_all_dictionaries(r.work, len(r.files), args.frequency_limit)
    cardinalities = [d.height + FIRST_FREQUENT_ID for d in dictionaries]
    report["cardinalities"] = cardinalities
    print(f"[criteo] {time.time() - r.started:7.1f} s  dictionaries: cardinalities {cardinalities}; "
          f"{_peak_rss_note()}", flush=True)
    _save_dictionaries(r.work, dictionaries)
    lookups = [ColumnLookup(d) for d in dictionaries]
    del dictionaries
    out = _open_outputs(r, report, cardinalities)
    report["rows_padded"] = _write_pass(r, out, report, info, bounds, lookups)
    print(f"[criteo] {time.time() - r.started:7.1f} s  pass 2 done; {_peak_rss_note()}", flush=True)
    _finish_train(r, out, info, report)
    _publish(r, out, report, cardinalities)
    print(f"[criteo] wrote {args.output_path}: rows {json.dumps(report['rows_written'])}, malformed "
          f"{malformed_total(report)}, padded {sum(report['rows_padded'].values())}, {report['seconds']} s; "
          f"{_peak_rss_note()}", flush=True)
    return report


# ----------------------------------------------------------------------------------------------------- train shuffle
# Bytes per train row while a bucket is permuted: label 1 + numerical 26 + ids 104, the permutation 8, and the
# largest permuted column (numerical, 26), rounded up.
_BUCKET_ROW_BYTES = 176


def bucket_rows(args: argparse.Namespace) -> int:
    """Train rows per shuffle bucket: ``--shuffle_bucket_rows``, or as many as ``--shuffle_memory_mb`` holds."""
    if args.shuffle_bucket_rows:
        return args.shuffle_bucket_rows
    return max(1, (args.shuffle_memory_mb << 20) // _BUCKET_ROW_BYTES)


def _bucket_count(train_rows: int, bucket_rows: int) -> int:
    return max(1, -(-train_rows // bucket_rows))


def _scatter(directory: str, k: int, label, numerical, ids, seed: int, file_index: int, buckets: int) -> None:
    """Chunk ``k``'s train rows into ``chunk_<k>.{label,numerical,ids}``, grouped by a random bucket per row
    (``chunk_<k>.offsets.npy``: the first row of each bucket). ``ids`` [26, n] is stored row-major, so that a bucket is
    one contiguous range of every file."""
    rng = np.random.default_rng([seed, file_index, k])
    bucket = rng.integers(0, buckets, len(label))
    order = np.argsort(bucket, kind="stable") if buckets > 1 else np.arange(len(label))
    base = os.path.join(directory, f"chunk_{k}")
    label[order].tofile(base + ".label")
    numerical[order].tofile(base + ".numerical")
    np.ascontiguousarray(ids[:, order].T).tofile(base + ".ids")
    np.save(base + ".offsets.npy", np.searchsorted(bucket[order], np.arange(buckets + 1)))


class TrainRows:
    """The train rows in input order, held in memory in their output dtypes (when they fit one shuffle bucket), then
    written once in the order of one permutation drawn from the seed."""

    def __init__(self, writer: SplitBinaryAppender, rows: int):
        self.writer = writer
        self.columns = {features: np.empty((rows, len(features)) if len(features) > 1 else rows,
                                           dtype=writer.dtypes[features]) for features in writer.paths}
        self.rows = 0

    def append(self, label: np.ndarray, numerical: np.ndarray, ids: np.ndarray) -> None:
        """As ``SplitBinaryAppender.append`` (the same casts)."""
        at, n = self.rows, len(label)
        for features, column in self.columns.items():
            if features[0] == "label":
                column[at:at + n] = label
            elif features[0].startswith("num_"):
                column[at:at + n] = numerical
            else:
                column[at:at + n] = ids[int(features[0][4:-4])]
        self.rows += n

    def write_permuted(self, seed: int) -> None:
        """Each train file, written whole: its column in the permutation's order (one permuted column at a time
        is added to the memory), the column freed once written."""
        order = np.random.default_rng([seed, 1 << 21]).permutation(self.rows)
        for n, (features, path) in enumerate(self.writer.paths.items()):
            column = self.columns.pop(features)[:self.rows]
            with open(path, "wb") as f:
                f.write(np.take(column, order, axis=0).data)   # take: faster than fancy indexing
            column = None
            _maybe_killed("permute", n + 1)


def _assemble_shuffle(work: str, files: List[str], info, state: WorkState, writer: SplitBinaryAppender, seed: int,
                      buckets: int, total: int) -> None:
    """Each bucket: its rows from every chunk, permuted in memory, appended to the train files. Memory: one bucket
    (``--shuffle_bucket_rows`` rows, at most ``_BUCKET_ROW_BYTES`` each with the permutation and one permuted
    column); the bucket offsets stay on disk."""
    sources = []
    for index, path in enumerate(files):
        directory = os.path.join(work, "shuffle", str(index))
        for k in range(info[os.path.basename(path)]["chunks"]):
            base = os.path.join(directory, f"chunk_{k}")
            if os.path.exists(base + ".offsets.npy"):
                sources.append(base)
    progress = Progress("shuffle (train buckets)", buckets, "buckets")
    for b in range(buckets):
        if state.data["buckets"].get(str(b)):
            continue
        writer.truncate(state.data.get("bucket_sizes", {}))   # train files are empty before the first bucket
        ranges = []
        for base in sources:
            offsets = np.load(base + ".offsets.npy", mmap_mode="r")
            lo, hi = int(offsets[b]), int(offsets[b + 1])
            if hi > lo:
                ranges.append((base, lo, hi))
        rows = sum(hi - lo for _, lo, hi in ranges)
        if rows:
            # Read straight into the bucket's arrays (no list of pieces to concatenate: that would double the peak).
            label = np.empty(rows, np.int8)
            numerical = np.empty((rows, NUM_NUMERICAL), np.float16)
            bucket_ids = np.empty((rows, NUM_CATEGORICAL), np.int32)
            at = 0
            for base, lo, hi in ranges:
                n = hi - lo
                for suffix, array in ((".label", label), (".numerical", numerical), (".ids", bucket_ids)):
                    row_bytes = array.itemsize * (array.shape[1] if array.ndim > 1 else 1)
                    with open(base + suffix, "rb") as f:
                        f.seek(lo * row_bytes)
                        if f.readinto(memoryview(array[at:at + n]).cast("B")) != n * row_bytes:
                            raise CriteoPreprocessError(f"internal: {base + suffix} is shorter than recorded")
                at += n
            order = np.random.default_rng([seed, 1 << 20, b]).permutation(rows)
            # One column at a time: the permuted copy of a column is all that is added to the bucket in memory.
            for features, path in writer.paths.items():
                if features[0] == "label":
                    block = label[order].astype(np.bool_)
                elif features[0].startswith("num_"):
                    block = numerical[order]
                else:
                    block = bucket_ids[order, int(features[0][4:-4])].astype(writer.dtypes[features])
                with open(path, "ab") as f:
                    f.write(block.data)
                block = None
            label = numerical = bucket_ids = order = None
        state.data["buckets"][str(b)] = {"rows": rows}
        state.data["bucket_sizes"] = writer.sizes()
        state.save()
        _maybe_killed("bucket", b + 1)
        progress.update(b + 1, rows)
    progress.update(buckets, 0, force=True)


# Set by the command line (a process of its own): ``run`` may then tune the allocators (``tune_allocators``).
_TUNE_ALLOCATORS = False


def tune_allocators() -> None:
    """For a process that runs this engine on an input held in memory (``--hold_input_mb``; the command line): the
    allocators keep freed memory for reuse instead of handing it back to the kernel, because fresh pages are slow to
    get on these VMs (each is zeroed and faulted in; a third of this engine's CPU time went to the kernel; about 10 %
    less CPU with this). Polars' jemalloc: no background purging thread, no decay (``_RJEM_MALLOC_CONF``, read when
    Polars loads: call this before importing polars; a value already set wins). glibc (NumPy's arrays): blocks up to
    32 MiB from the heap, not fresh mappings, and the heap not trimmed. Larger inputs keep the default allocators:
    with these settings a 6M-row run peaked at 1,264 MiB instead of 907 MiB (memory kept by each thread's arena
    across the passes), and their peak must stay flat with the input (README)."""
    os.environ.setdefault("_RJEM_MALLOC_CONF", "background_thread:false,dirty_decay_ms:-1,muzzy_decay_ms:-1")
    glibc_malloc_options(mmap_threshold=32 << 20, trim_threshold=1 << 30)   # 32 MiB: glibc's largest allowed


def main(argv: Optional[Sequence[str]] = None) -> Dict[str, Any]:
    """Entry point: returns the report (also written to OUTPUT_PATH/preprocess_report.json)."""
    args = parse_args(argv)
    import gc
    # The run makes no reference cycles worth collecting, and the collections its allocations trigger were a few
    # percent of its time (scanning every live object).
    enabled = gc.isenabled()
    gc.disable()
    try:
        return run(args)
    finally:
        if enabled:
            gc.enable()


if __name__ == "__main__":
    import atexit
    from recsys_common.cli import run_main
    atexit.register(gc.freeze)   # nor one over every object at the interpreter's exit
    _TUNE_ALLOCATORS = True
    run_main(main, input_errors=(CriteoInputError, CriteoPreprocessError, FileExistsError))
