"""What both Criteo engines (Polars, Spark) say about a run's input: the error for a result that cannot be trusted,
and the one rule for malformed rows (report them with examples; refuse an input with no rows, or with more malformed
rows than ``--max_malformed_fraction`` allows)."""
from __future__ import annotations

import json
from typing import Any, Dict, List, Sequence

from . import SPLITS


class CriteoPreprocessError(RuntimeError):
    """The run cannot produce a trustworthy dataset (too many malformed rows, an inconsistent line index, a changed
    input on resume)."""


def check_malformed(input_path: str, report: Dict[str, Any], examples: Sequence[Dict[str, Any]],
                    max_malformed_fraction: float) -> None:
    """Print the malformed rows of ``report`` (``rows_read``, ``rows_malformed``) with up to five ``examples``
    (``file``, ``line`` or None, ``reason``, ``text``), and refuse an input with no rows or too many malformed."""
    malformed = report["rows_malformed"]
    total_rows = sum(report["rows_read"].values())
    total_malformed = sum(sum(m.values()) for m in malformed.values())
    if total_malformed:
        print(f"[criteo] {total_malformed} malformed row(s) of {total_rows} excluded: {json.dumps(malformed)}",
              flush=True)
        for e in examples[:5]:
            where = f"{e['file']}:{e['line']}" if e.get("line") is not None else e["file"]
            print(f"[criteo]   {where}: {e['reason']}: {e['text'][:120]!r}", flush=True)
    if total_rows == 0:
        raise CriteoPreprocessError(f"{input_path}: no rows")
    if total_malformed > max_malformed_fraction * total_rows:
        raise CriteoPreprocessError(
            f"{input_path}: {total_malformed} of {total_rows} rows are malformed "
            f"({total_malformed / total_rows:.2%} > --max_malformed_fraction {max_malformed_fraction:.2%}): "
            f"{json.dumps(malformed)}; first: {json.dumps(list(examples[:3]))}")


def malformed_total(report: Dict[str, Any]) -> int:
    return sum(sum(m.values()) for m in report["rows_malformed"].values())


def rows_written(rows_read: Dict[str, int], malformed: Dict[str, Dict[str, int]]) -> Dict[str, int]:
    """Rows each split writes: those read less the malformed."""
    return {s: rows_read[s] - sum(malformed[s].values()) for s in SPLITS}


__all__: List[str] = ["CriteoPreprocessError", "check_malformed", "malformed_total", "rows_written"]
