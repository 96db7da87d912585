"""Which raw files make up a Criteo dataset, and how their rows are split into train / test / validation.

Terabyte (``day_0`` ... ``day_23``, optionally ``.gz``): every day but the last is ``train``; the last day's first
half of lines is ``test`` and its second half ``validation`` (NVIDIA's split: train = days 0..22, test = first half
of day 23, validation = second half). Fewer days (``day_0..day_N``, N >= 1) are accepted for small runs and follow
the same rule with the last day present.

Kaggle (``train.txt``, 45,840,617 lines over 7 days in time order; NVIDIA's recipe does not support it): the first
``L - L // 7`` lines are ``train``; the last ``L // 7`` lines (the last "day", as facebookresearch/dlrm splits it)
are split the same way: first half ``test``, second half ``validation``.

"Half" is by line: the first ``ceil(n / 2)`` lines of the held-out part are ``test``. Malformed lines are excluded
after the split, so the split of a file never depends on which of its lines are malformed.

    >>> split_boundaries("kaggle", 1999)
    (1714, 1857)
    >>> split_boundaries("terabyte", 11)
    (0, 6)
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import List, Tuple

KAGGLE_NAMES = ("train.txt", "train.txt.gz")
_DAY_RE = re.compile(r"^day_(\d+)(\.gz)?$")


class CriteoInputError(ValueError):
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
