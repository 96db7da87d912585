"""Logging compatible with NVIDIA's DLLogger JSON stream, plus readable stdout lines.

Every line of the JSON log is ``DLLL {json}`` with the keys DLLogger writes, so NVIDIA's log tooling reads ours:

    DLLL {"timestamp": "1732280000.12", "datetime": "2026-11-22 15:00:00.120000", "elapsedtime": "3.5",
          "type": "LOG", "step": [1, 200], "data": {"loss": 0.52}}

Hyper-parameters are logged with ``step: "PARAMETER"``, the final summary with ``step: []`` (DLLogger's ``tuple()``),
metric metadata as ``type: "METADATA"`` lines. Only rank 0 writes anything; other ranks get a silent logger.

    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "log.json")
    >>> log = Logger(path, stdout=False)
    >>> log.log_parameters({"lr": 0.1}); log.log(step=(0, 1), data={"loss": 0.5}); log.log_summary({"auc": 0.7})
    >>> [r["step"] for r in read_log(path)]
    ['PARAMETER', [0, 1], []]
"""
from __future__ import annotations

import datetime as _dt
import json
import math
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence, Union

Step = Union[str, int, Sequence[int]]


def _jsonable(value: Any) -> Any:
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        try:
            return value.item()
        except (ValueError, RuntimeError):
            pass
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def keep_previous_log(path: str) -> Optional[str]:
    """Rename an existing non-empty log to the next free ``path.N``; returns the backup's name (None: nothing kept).

    Numbered backups (rather than one ``.bak``) so that two reruns never lose the first run's log either.
    """
    if not os.path.lexists(path):
        return None
    if not os.path.isfile(path):
        raise FileExistsError(f"{path}: --log_path exists and is not a regular file")
    if os.path.getsize(path) == 0:
        return None   # an empty log holds nothing to keep; the new run writes over it
    n = 1
    while os.path.lexists(f"{path}.{n}"):
        n += 1
    backup = f"{path}.{n}"
    os.rename(path, backup)
    return backup


class Logger:
    """DLLogger-compatible logger.

    Args:
        path: JSON stream file (``None``: no file). Its directory is created.
        rank: process rank; only rank 0 writes.
        stdout: also print readable lines.
        append: append to an existing log (resumed runs) instead of starting a new one.

    A new run (``append=False``) never destroys an earlier log: an existing non-empty file at ``path`` is first renamed
    to the next free numbered backup (``log.json.1``, ``log.json.2``, ...; the highest number is the most recent), with
    a note on stderr. A resumed run (``append=True``) continues the same file.
    """

    def __init__(self, path: Optional[str] = "log.json", rank: int = 0, stdout: bool = True, append: bool = False):
        self.enabled = rank == 0
        self.stdout = stdout and self.enabled
        self.start = time.time()
        self._file = None
        if self.enabled and path:
            directory = os.path.dirname(os.path.abspath(path))
            os.makedirs(directory, exist_ok=True)
            if not append:
                backup = keep_previous_log(path)
                if backup:
                    print(f"note: {path} exists; the earlier log was kept as {backup}", file=sys.stderr, flush=True)
            self._file = open(path, "a" if append else "w", encoding="utf-8")

    def _emit(self, record: Dict[str, Any]) -> None:
        if self._file is not None:
            self._file.write("DLLL " + json.dumps(record) + "\n")
            self._file.flush()

    def _base(self, kind: str) -> Dict[str, Any]:
        now = time.time()
        return {"timestamp": str(now), "datetime": str(_dt.datetime.now()),
                "elapsedtime": str(now - self.start), "type": kind}

    def log(self, step: Step, data: Dict[str, Any]) -> None:
        if not self.enabled:
            return
        step_value = step if isinstance(step, str) else ([step] if isinstance(step, int) else list(step))
        record = self._base("LOG")
        record.update({"step": step_value, "data": _jsonable(data)})
        self._emit(record)
        if self.stdout:
            print(self._readable(step_value, data), flush=True)

    def log_parameters(self, params: Dict[str, Any]) -> None:
        self.log("PARAMETER", params)

    def log_summary(self, data: Dict[str, Any]) -> None:
        self.log((), data)

    def metadata(self, metric: str, meta: Dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = self._base("METADATA")
        record.update({"metric": metric, "metadata": _jsonable(meta)})
        self._emit(record)

    @staticmethod
    def _readable(step: Any, data: Dict[str, Any]) -> str:
        if isinstance(step, str):   # PARAMETER, or a named record such as RELIABILITY
            label = step
        else:
            label = "SUMMARY" if step == [] else "step " + " ".join(str(s) for s in step)

        def fmt(v):
            if isinstance(v, float):
                return f"{v:.6g}"
            if isinstance(v, (list, tuple)) and v and isinstance(v[0], (list, tuple)):
                return f"[{len(v)} rows in the JSON log]"   # a table (e.g. reliability buckets): unreadable inline
            return str(_jsonable(v))
        return f"[{label}] " + "  ".join(f"{k}: {fmt(v)}" for k, v in data.items())

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "Logger":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_log(path: str, kinds: Sequence[str] = ("LOG",)) -> List[Dict[str, Any]]:
    """Parse a DLLogger JSON stream; lines that are not ``DLLL {...}`` are ignored."""
    records = []
    with open(path, "r", encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("DLLL "):
                continue
            record = json.loads(line[5:])
            if record.get("type") in kinds:
                records.append(record)
    return records


def hms(seconds: float) -> str:
    """``H:MM:SS`` of a duration (rounded down, negative as 0; "?" when not finite): every ETA the training loops
    and the data tools' progress lines print.

    >>> hms(3725.9), hms(-1), hms(float("inf"))
    ('1:02:05', '0:00:00', '?')
    """
    if not math.isfinite(seconds):
        return "?"
    seconds = int(max(seconds, 0))
    return f"{seconds // 3600}:{seconds % 3600 // 60:02d}:{seconds % 60:02d}"


class Progress:
    """The one progress line of every long job: done of total, rate and time left, at most every ``every`` seconds.

    ``[prefix] what: 1,048,576 of 40,428,967 rows (2.6 %), 310,000 rows/s, 0:02:07 left``

    Args:
        what: the job's label, with its ``[tool]`` prefix (printed first).
        total: the amount of work (rows, batches, bytes...); ``estimated``: print it as ``~total``.
        unit: what ``done`` counts; ``scale`` divides the printed amounts (``2**20`` with unit ``MiB``) and
            ``digits`` their decimals.
        every: seconds between lines (an ``update(..., final=True)`` or reaching ``total`` always prints).
        out: where lines go (default: stdout; pass ``log_to_stderr`` for tools whose stdout is data); ``False``:
            nowhere: the training loops, which print in their own (NVIDIA's) formats, take only the figures
            (:meth:`rate`, :meth:`seconds_left`, over the window since :meth:`restart`).

        >>> clock = [0.0]
        >>> p = Progress("[tool] pass 1", 1000, every=5, out=print, clock=lambda: clock[0])
        >>> clock[0] = 2.0; p.update(400)            # too soon after the start: nothing printed
        >>> clock[0] = 6.0; p.update(200)
        [tool] pass 1: 600 of 1,000 rows (60.0 %), 100 rows/s, 0:00:04 left
        >>> p.set(1000)                              # done: always printed
        [tool] pass 1: 1,000 of 1,000 rows (100.0 %), 167 rows/s, 0:00:00 left
        >>> loop = Progress("", 100, out=False, clock=lambda: clock[0])  # figures only
        >>> clock[0] = 16.0; loop.set(20); loop.rate(), hms(loop.seconds_left())
        (2.0, '0:00:40')
    """

    def __init__(self, what: str, total: float, unit: str = "rows", every: float = 5.0, out=None,
                 scale: float = 1.0, digits: int = 0, estimated: bool = False, clock=time.monotonic):
        self.what, self.total, self.unit, self.every = what, total, unit, every
        self.scale, self.digits, self.estimated = scale, digits, estimated
        self.out = (lambda line: print(line, flush=True)) if out is None else out
        self.clock = clock
        self.started = self.last = clock()
        self.done = 0

    def update(self, increment: float, final: bool = False) -> None:
        """``increment`` more done; prints when due."""
        self.set(self.done + increment, final)

    def set(self, done: float, final: bool = False) -> None:
        """``done`` so far; prints when due (``final``, or ``done`` reached an exact ``total``: always)."""
        self.done = done
        if self.out is False:
            return
        now = self.clock()
        if not final and (done < self.total or self.estimated) and now - self.last < self.every:
            return
        self.last = now
        self.out(self.line())

    def restart(self, total: Optional[float] = None) -> None:
        """Measure from now on (a new window: nothing done yet), towards ``total`` when given."""
        self.started = self.last = self.clock()
        self.done = 0
        if total is not None:
            self.total = total

    def rate(self, now: Optional[float] = None) -> float:
        """Units done per second since the start."""
        return self.done / max((self.clock() if now is None else now) - self.started, 1e-9)

    def seconds_left(self, now: Optional[float] = None) -> float:
        """Time left at the rate so far (inf before anything is done)."""
        rate = self.rate(now)
        return max(self.total - self.done, 0) / rate if rate > 0 else float("inf")

    def line(self) -> str:
        now = self.clock()
        number = f"{{:,.{self.digits}f}}"
        share = 100.0 * min(self.done / self.total, 1.0) if self.total else 100.0
        return (f"{self.what}: {number.format(self.done / self.scale)} of {'~' if self.estimated else ''}"
                f"{number.format(self.total / self.scale)} {self.unit} ({share:.1f} %), "
                f"{number.format(self.rate(now) / self.scale)} {self.unit}/s, {hms(self.seconds_left(now))} left")


def check_finite(value: float, message: str, error_type: type = FloatingPointError, **fields: Any) -> float:
    """``value`` when finite, else ``error_type`` (a recipe's own, or ``FloatingPointError``) with ``message``
    formatted with ``value`` and ``fields`` (only then: no string is built on the good path): the one NaN/inf check
    of the training loops' host-side losses.

        >>> check_finite(0.5, "loss {value}")
        0.5
        >>> check_finite(float("nan"), "training loss is {value} at step {step}; lower --lr", step=3)
        Traceback (most recent call last):
        ...
        FloatingPointError: training loss is nan at step 3; lower --lr
    """
    if not math.isfinite(value):
        raise error_type(message.format(value=value, **fields))
    return value


def log_to_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
