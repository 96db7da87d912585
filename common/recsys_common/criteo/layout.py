"""Which raw files make up a Criteo dataset, and how their rows are split into train / test / validation.

Terabyte (``day_0`` ... ``day_23``, optionally ``.gz``): every day but the last is ``train``; the last day's first
half of lines is ``test`` and its second half ``validation`` (NVIDIA's split: train = days 0..22, test = first half
of day 23, validation = second half). Fewer days (``day_0..day_N``, N >= 1) are accepted for small runs and follow
the same rule with the last day present.

Kaggle (``train.txt``, 45,840,617 lines over 7 days in time order; NVIDIA's recipe does not support it): the first
``L - L // 7`` lines are ``train``; the last ``L // 7`` lines (the last "day", as facebookresearch/dlrm splits it)
are split the same way: first half ``test``, second half ``validation``.

"Half" is by line: the first ``ceil(n / 2)`` lines of the held-out part are ``test``. Malformed lines are excluded
after the split, so the split of a file never depends on which of its lines are malformed. A header line (see
``sniff_format``) is not a data line: it is skipped and not counted.

Each file's text format is found from its first line (``sniff_format``): the separator (tab, as Criteo publishes
it, or comma, as many public CSV copies) and whether that line is a header of column names.

    >>> split_boundaries("kaggle", 1999)
    (1714, 1857)
    >>> split_boundaries("terabyte", 11)
    (0, 6)
"""
from __future__ import annotations

import gzip
import os
import re
from dataclasses import dataclass, field
from typing import List, Tuple

from recsys_common.cli import InputError

KAGGLE_NAMES = ("train.txt", "train.txt.gz")
_DAY_RE = re.compile(r"^day_(\d+)(\.gz)?$")


# Integral numbers in the spellings integer features come in (both engines' integral_value); each fits a signed
# 64-bit long.
INTEGER_RE = r"^[+-]?[0-9]{1,18}$"                                   # 260, -3, +7
MAX_INTEGER = 10 ** 18 - 1                                             # the largest with INTEGER_RE's 18 digits
ZERO_FRACTION_RE = r"^[+-]?[0-9]{1,18}[.]0*$"                        # 260.0, 260.
EXPONENT_RE = r"^[+-]?([0-9]+[.]?[0-9]*|[.][0-9]+)[eE][+-]?[0-9]{1,2}$"   # 2.6e2, 1e3, 2.600e+02
# Exponent spellings are converted through a double: exact (no rounding can make a non-integer look integral, or
# change an integer) while the mantissa has at most 15 digits and the value is below 2**53.
MAX_MANTISSA_DIGITS = 15
MAX_EXACT_DOUBLE_INTEGER = float(2 ** 53)


class CriteoInputError(InputError):
    """The input path does not hold a Criteo dataset in a layout this job understands."""


@dataclass
class InputLayout:
    kind: str                                   # "terabyte" or "kaggle"
    train_files: List[str] = field(default_factory=list)   # files whose lines are all train
    split_file: str = ""                        # file whose lines are split by split_boundaries()

    def describe(self) -> dict:
        return {"kind": self.kind, "train_files": [os.path.basename(p) for p in self.train_files],
                "split_file": os.path.basename(self.split_file)}


def split_boundaries(kind: str, num_lines: int) -> Tuple[int, int]:
    """``(train_end, test_end)`` line indices of the split file: ``[0, train_end)`` train, ``[train_end, test_end)``
    test, ``[test_end, num_lines)`` validation."""
    if num_lines < 0:
        raise ValueError(f"num_lines must be >= 0, got {num_lines}")
    if kind == "terabyte":
        train_end = 0
    elif kind == "kaggle":
        train_end = num_lines - num_lines // 7
    else:
        raise ValueError(f"unknown layout kind {kind!r} (terabyte or kaggle)")
    held_out = num_lines - train_end
    return train_end, train_end + (held_out + 1) // 2


def _day_files(directory: str) -> List[Tuple[int, str]]:
    days = {}
    for name in sorted(os.listdir(directory)):
        match = _DAY_RE.match(name)
        if not match or not os.path.isfile(os.path.join(directory, name)):
            continue
        day = int(match.group(1))
        if day in days:
            raise CriteoInputError(f"{directory}: day {day} is present twice ({os.path.basename(days[day])} and "
                                   f"{name}); keep either the compressed or the uncompressed file")
        days[day] = os.path.join(directory, name)
    return sorted(days.items())


def discover_input(path: str, layout: str = "auto") -> InputLayout:
    """Find the raw files under ``path`` (a directory, or Kaggle's ``train.txt`` itself)."""
    if layout not in ("auto", "terabyte", "kaggle"):
        raise CriteoInputError(f"--layout must be auto, terabyte or kaggle, got {layout!r}")
    if not os.path.exists(path):
        raise CriteoInputError(f"{path}: input path does not exist")
    if os.path.isfile(path):
        if layout == "terabyte":
            raise CriteoInputError(f"{path}: --layout terabyte needs a directory with day_0 ... day_23")
        return InputLayout("kaggle", [], os.path.abspath(path))

    days = _day_files(path)
    if days and layout in ("auto", "terabyte"):
        numbers = [d for d, _ in days]
        expected = list(range(len(days)))
        if numbers != expected:
            missing = sorted(set(range(max(numbers) + 1)) - set(numbers))
            raise CriteoInputError(f"{path}: day files must be day_0 ... day_N without gaps; missing "
                                   f"{', '.join(f'day_{d}' for d in missing)}")
        if len(days) < 2:
            raise CriteoInputError(f"{path}: found only day_0; the Terabyte layout needs at least two days "
                                   f"(train days, then the day split into test and validation)")
        files = [os.path.abspath(p) for _, p in days]
        return InputLayout("terabyte", files[:-1], files[-1])
    if layout == "terabyte":
        raise CriteoInputError(f"{path}: no day_<N> files (the Criteo Terabyte layout is day_0 ... day_23)")
    for name in KAGGLE_NAMES:
        candidate = os.path.join(path, name)
        if os.path.isfile(candidate):
            return InputLayout("kaggle", [], os.path.abspath(candidate))
    raise CriteoInputError(f"{path}: found neither day_0 ... day_23 (Criteo Terabyte) nor train.txt (Criteo Kaggle)")


# ----------------------------------------------------------------------------------------------- text format
HEADER_CHOICES = ("auto", "yes", "no")
DELIMITERS = {"tab": "\t", "comma": ","}
DELIMITER_CHOICES = ("auto",) + tuple(DELIMITERS)
# Names public copies give the label column, and the feature columns (Criteo's I1..I13 / C1..C26, Spark's _c0..,
# pandas-style col_3, f4, feature_5).
_LABEL_NAMES = {"label", "labels", "click", "clicked", "clicks", "target", "y"}
_COLUMN_NAME_RE = re.compile(r"^(i|c|_c|col|f|feature)_?[0-9]+$", re.IGNORECASE)
_SNIFF_BYTES = 1 << 20


@dataclass(frozen=True)
class FileFormat:
    delimiter: str      # "\t" or ","
    header: bool        # the first line is a header of column names, not data

    def describe(self) -> dict:
        return {"delimiter": "tab" if self.delimiter == "\t" else "comma", "header": self.header}


def first_line(path: str) -> str:
    """The file's first line (at most 1 MiB of it), gzip-aware, without its line ending or a UTF-8 byte-order mark."""
    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            data = f.read(_SNIFF_BYTES)
    except (OSError, EOFError) as e:
        raise CriteoInputError(f"{path}: cannot read: {e}") from None
    line = data.split(b"\n", 1)[0].rstrip(b"\r").decode("utf-8", errors="replace")
    return line[1:] if line.startswith("\ufeff") else line


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def looks_like_header(fields: List[str]) -> bool:
    """A first line is a header when its label field is not a number and it names columns: the label field is a
    label name (``label``, ``Label``, ``click``, ...) or at least half of the other fields are column names such as
    ``I1`` / ``C1`` / ``_c2``. Anything else stays data (and is reported as malformed if it is not a valid row)."""
    names = [f.strip().strip('"') for f in fields]
    if not names or not names[0] or _is_number(names[0]):
        return False
    if names[0].lower() in _LABEL_NAMES:
        return True
    rest = names[1:]
    return bool(rest) and 2 * sum(bool(_COLUMN_NAME_RE.match(n)) for n in rest) >= len(rest)


def sniff_format(path: str, header: str = "auto", delimiter: str = "auto") -> FileFormat:
    """The text format of one raw file. ``delimiter``: ``auto`` (tab if the first line has a tab, else comma if it
    has a comma, else tab), ``tab`` or ``comma``. ``header``: ``auto`` (``looks_like_header`` of the first line),
    ``yes`` (every file's first line is a header) or ``no``."""
    if header not in HEADER_CHOICES:
        raise CriteoInputError(f"--header must be one of {', '.join(HEADER_CHOICES)}, got {header!r}")
    if delimiter not in DELIMITER_CHOICES:
        raise CriteoInputError(f"--delimiter must be one of {', '.join(DELIMITER_CHOICES)}, got {delimiter!r}")
    line = first_line(path) if "auto" in (header, delimiter) else ""
    if delimiter == "auto":
        sep = "\t" if "\t" in line or "," not in line else ","
    else:
        sep = DELIMITERS[delimiter]
    has_header = header == "yes" or (header == "auto" and looks_like_header(line.split(sep)))
    return FileFormat(sep, has_header)
