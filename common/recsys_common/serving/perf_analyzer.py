"""Triton's perf_analyzer against a served model, on the same batch sizes, concurrencies and request data as our
``latency.measure_latency``, so the two tools' throughputs can be put side by side.

    records = run_perf_analyzer("127.0.0.1:8001", "grpc", "ncf-onnx", make_inputs, batch_size=64,
                                concurrencies=[1, 2])
    # [{"tool": "perf_analyzer", "batch_size": 64, "concurrency": 1, "throughput_samples_per_s": ...,
    #   "latency_ms": {"p50", "p90", "p95", "p99"}}, ...]

The binary: ``make setup`` installs the ``perf_analyzer`` that ships in the ``tritonclient==2.35.0`` wheel (later
wheels dropped it) into ``<venv>/opt/perf_analyzer/`` with a wrapper that puts ``libcudart.so.12`` (from the
``nvidia-cuda-runtime-cu12`` wheel; no GPU is needed) on ``LD_LIBRARY_PATH``; it also needs the Debian package
``libb64-0d``. ``find_perf_analyzer`` looks, in order, at ``$RECSYS_PERF_ANALYZER``, that wrapper, and ``PATH``.

Request data: perf_analyzer's own random data would hold ids outside the models' tables (which the server refuses),
so the requests are built from ``make_inputs(batch_size)`` (the rows ``evaluate_latency`` sends) and given to
perf_analyzer as an ``--input-data`` JSON file, one step per row.

perf_analyzer measures in windows of ``measurement_interval_ms`` until three in a row agree within
``stability_percent`` (at most ``max_trials`` windows); on a loaded machine a tight stability never settles, so the
default here is loose (the throughput is still the mean of the last three windows).
"""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from .client import ServingError

MakeInputs = Callable[[int], Mapping[str, np.ndarray]]
ENV_VAR = "RECSYS_PERF_ANALYZER"


class PerfAnalyzerNotFound(ServingError):
    """No perf_analyzer binary: the message says how to get one."""


def default_location() -> str:
    """Where ``make setup`` (ci/setup_env.sh) puts the wrapper: ``<venv>/opt/perf_analyzer/perf_analyzer``."""
    return os.path.join(sys.prefix, "opt", "perf_analyzer", "perf_analyzer")


def find_perf_analyzer() -> str:
    """The perf_analyzer command: ``$RECSYS_PERF_ANALYZER``, else ``default_location()``, else ``perf_analyzer`` on
    PATH. Raises ``PerfAnalyzerNotFound``."""
    explicit = os.environ.get(ENV_VAR)
    if explicit:
        if not (os.path.isfile(explicit) and os.access(explicit, os.X_OK)):
            raise PerfAnalyzerNotFound(f"${ENV_VAR}={explicit}: not an executable file")
        return explicit
    for candidate in (default_location(), shutil.which("perf_analyzer")):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise PerfAnalyzerNotFound(
        f"perf_analyzer not found (looked at ${ENV_VAR}, {default_location()} and PATH); `make setup` installs it "
        f"from the tritonclient==2.35.0 wheel (it also needs `apt-get install libb64-0d`)")


def write_input_data(path: str, inputs: Mapping[str, np.ndarray]) -> None:
    """perf_analyzer's ``--input-data`` JSON: one step per row of ``inputs`` (arrays batch first, one row count),
    each input's row flattened with its shape without the batch dimension."""
    rows = {len(a) for a in inputs.values()}
    if len(rows) != 1:
        raise ValueError(f"inputs must share one row count, got {({n: len(a) for n, a in inputs.items()})}")
    steps = []
    for i in range(rows.pop()):
        steps.append({name: {"content": np.asarray(a[i]).reshape(-1).tolist(), "shape": list(np.shape(a[i]))}
                      for name, a in inputs.items()})
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"data": steps}, f)


def _tail(text: str, lines: int = 25) -> str:
    return "\n".join((text or "").strip().splitlines()[-lines:])


def run_perf_analyzer(url: str, protocol: str, model: str, make_inputs: Optional[MakeInputs], batch_size: int,
                      concurrencies: Sequence[int], *, measurement_interval_ms: int = 500,
                      stability_percent: float = 1000.0, max_trials: int = 10, timeout_s: float = 120.0,
                      binary: Optional[str] = None, extra_args: Sequence[str] = ()) -> List[dict]:
    """Run perf_analyzer once for ``batch_size`` over ``concurrencies``; one record per concurrency.

    Args:
        url, protocol, model: the server ("host:port"), "grpc" or "http", the model name.
        make_inputs: batch size -> {input name: array}; its rows become the request data. None: perf_analyzer's
            own data (``--input-data zero``).
        measurement_interval_ms, stability_percent, max_trials: perf_analyzer's ``-p``, ``-s``, ``-r``.
        timeout_s: limit for the whole run (perf_analyzer is killed after it; its requests have no timeout).
    Returns: [{"tool": "perf_analyzer", "protocol", "model", "batch_size", "concurrency",
    "throughput_samples_per_s", "throughput_requests_per_s", "latency_ms": {"p50", "p90", "p95", "p99"}}].
    Raises ``ServingError`` with perf_analyzer's own message (unknown model, unreachable server, refused request)
    or when it runs past ``timeout_s``.
    """
    if protocol not in ("grpc", "http"):
        raise ValueError(f"protocol must be 'grpc' or 'http', got {protocol!r}")
    if batch_size < 1 or not concurrencies or min(concurrencies) < 1:
        raise ValueError(f"batch size and concurrencies must be >= 1, got {batch_size}, {list(concurrencies)}")
    command = binary or find_perf_analyzer()
    with tempfile.TemporaryDirectory(prefix="recsys_perf_analyzer_") as workdir:
        csv_path = os.path.join(workdir, "perf.csv")
        args = [command, "-m", model, "-u", url, "-i", protocol, "-b", str(int(batch_size)),
                "--concurrency-range", f"{min(concurrencies)}:{max(concurrencies)}:"
                                       f"{_step(concurrencies)}",
                "--measurement-interval", str(int(measurement_interval_ms)), "-s", f"{stability_percent:g}",
                "-r", str(int(max_trials)), "-f", csv_path]
        if make_inputs is not None:
            data_path = os.path.join(workdir, "input_data.json")
            write_input_data(data_path, make_inputs(int(batch_size)))
            args += ["--input-data", data_path]
        else:
            args += ["--input-data", "zero"]
        args += list(extra_args)
        try:
            proc = subprocess.run(args, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout_s,
                                  start_new_session=True)
        except subprocess.TimeoutExpired as e:
            raise ServingError(f"perf_analyzer against {url} ({protocol}), model {model!r}: no result after "
                               f"{timeout_s:g} s (killed); its output:\n{_tail(str(e.stdout or ''))}") from None
        output = (proc.stdout or "") + (proc.stderr or "")
        if proc.returncode != 0 or not os.path.isfile(csv_path):
            raise ServingError(f"perf_analyzer against {url} ({protocol}), model {model!r} failed (exit "
                               f"{proc.returncode}): {_tail(output)}")
        with open(csv_path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    wanted = {int(c) for c in concurrencies}
    records = []
    for row in rows:
        concurrency = int(row["Concurrency"])
        if concurrency not in wanted:
            continue
        samples = float(row["Inferences/Second"])
        latency_us = {k: float(row[f"{k} latency"]) for k in ("p50", "p90", "p95", "p99")}
        records.append({"tool": "perf_analyzer", "protocol": protocol, "model": model, "batch_size": int(batch_size),
                        "concurrency": concurrency, "throughput_samples_per_s": samples,
                        "throughput_requests_per_s": samples / batch_size,
                        # the CSV has percentiles only (the mean needs Triton's server-side statistics)
                        "latency_ms": {k: v / 1000.0 for k, v in latency_us.items()}})
    missing = wanted - {r["concurrency"] for r in records}
    if missing:
        raise ServingError(f"perf_analyzer against {url} ({protocol}), model {model!r}: no figures for concurrency "
                           f"{sorted(missing)}; its output:\n{_tail(output)}")
    return sorted(records, key=lambda r: r["concurrency"])


def _step(concurrencies: Sequence[int]) -> int:
    """perf_analyzer's concurrency range is start:end:step; the levels asked for must lie on it."""
    levels = sorted({int(c) for c in concurrencies})
    if len(levels) == 1:
        return 1
    gaps = {b - a for a, b in zip(levels, levels[1:])}
    if len(gaps) != 1:
        raise ValueError(f"concurrencies {levels} are not evenly spaced (perf_analyzer takes start:end:step)")
    return gaps.pop()


def format_comparison(record: dict) -> str:
    other = record["perf_analyzer"]
    return (f"{record['protocol']:>4}  batch {record['batch_size']:>6}  concurrency {record['concurrency']:>3}  "
            f"ours {record['throughput_samples_per_s']:>11,.0f} samples/s (p50 {record['latency_ms']['p50']:7.2f} ms)"
            f"  perf_analyzer {other['throughput_samples_per_s']:>11,.0f} samples/s (p50 "
            f"{other['latency_ms']['p50']:7.2f} ms)  ratio {record['throughput_ratio']:.2f}")


#: Bounds on ours / perf_analyzer's throughput (best of 2 rounds each), from runs on a loaded 2-core AMD EPYC VM
#: (load average 8-18: CI and other jobs beside it; figures in common/README.md and the recipes' READMEs). Single
#: settings ranged 0.21-7.4 (a burst of load hits whichever tool runs at that moment), the geometric mean over a run's
#: four settings 0.6-1.7. The mean is the check: a unit slip (requests for samples, a factor of the batch size, 16 or
#: more in the tests; ms for s) moves it far outside; a single setting only has to be within a sanity range.
SINGLE_RATIO_BOUNDS = (0.05, 20.0)
MEAN_RATIO_BOUNDS = (1 / 3.5, 3.5)


def check_agreement(records: Sequence[dict], single=SINGLE_RATIO_BOUNDS, mean=MEAN_RATIO_BOUNDS) -> float:
    """Raise ``AssertionError`` with the side-by-side table unless every record's ``throughput_ratio`` is within
    ``single`` and their geometric mean within ``mean``; return the geometric mean."""
    ratios = np.array([r["throughput_ratio"] for r in records], dtype=np.float64)
    geo = float(np.exp(np.log(ratios).mean()))
    table = "\n".join(format_comparison(r) for r in records)
    if not (ratios.min() >= single[0] and ratios.max() <= single[1] and mean[0] <= geo <= mean[1]):
        raise AssertionError(f"our throughput and perf_analyzer's disagree (each ratio must be in {single}, their "
                             f"geometric mean {geo:.2f} in {mean}):\n{table}")
    return geo
