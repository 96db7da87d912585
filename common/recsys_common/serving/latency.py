"""Throughput and latency of a served model against batch size and concurrency (the core of every recipe's
``evaluate_latency``), written as JSON and a PNG plot.

Each concurrency level runs that many threads, each with its own client, sending requests back to back (closed
loop, like Triton's perf_analyzer with ``--concurrency-range``). Latency is the client-side time of one ``infer``
call; throughput is rows answered per second of wall time over all threads.

A recipe's ``evaluate_latency.py``:

    parser = argparse.ArgumentParser(description=...)
    add_latency_arguments(parser, default_model_name="dlrm-onnx")
    args = parser.parse_args(argv)
    run_latency(server_url=args.server_url, protocol=args.protocol, model_name=args.model_name,
                batch_sizes=args.batch_sizes, concurrency=args.concurrency, num_requests=args.num_requests,
                warmup_requests=args.warmup_requests, timeout_s=args.timeout, output_json=args.output_json,
                output_png=args.output_png, make_inputs=make_inputs, output_names=["probability"])
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import threading
import time
from typing import Callable, Dict, List, Mapping, Optional, Sequence

import numpy as np

from recsys_common.flags import add_flag
from recsys_common.io import atomic_path, atomic_write_text, check_json_output

from .client import InferenceClient, ServingError
from .perf_analyzer import find_perf_analyzer, format_comparison, run_perf_analyzer
from recsys_common.machine import cpu_model_name as _cpu_model

MakeInputs = Callable[[int], Mapping[str, np.ndarray]]
PERCENTILES = (50, 90, 95, 99)


def _summary_ms(latencies_s: Sequence[float]) -> Dict[str, float]:
    ms = np.asarray(latencies_s, dtype=np.float64) * 1000.0
    out = {"mean": float(ms.mean())}
    out.update({f"p{p}": float(np.percentile(ms, p)) for p in PERCENTILES})
    return out


def _run_level(url: str, protocol: str, model: str, inputs: Mapping[str, np.ndarray], output_names: Sequence[str],
               concurrency: int, num_requests: int, warmup_requests: int, timeout_s: float):
    """``num_requests`` requests over ``concurrency`` threads; returns (latencies in s, wall seconds)."""
    shares = [num_requests // concurrency + (1 if i < num_requests % concurrency else 0) for i in range(concurrency)]
    warmups = [warmup_requests // concurrency + (1 if i < warmup_requests % concurrency else 0)
               for i in range(concurrency)]
    latencies: List[List[float]] = [[] for _ in range(concurrency)]
    # wall time = first request start to last request end, over all threads (taken by the workers themselves: the
    # main thread may be descheduled after the barrier opens, and would then under-count)
    spans: List[List[float]] = [[] for _ in range(concurrency)]
    errors: List[BaseException] = []
    ready = threading.Barrier(concurrency + 1, timeout=timeout_s * (1 + max(warmups)) + 30)
    done = threading.Barrier(concurrency + 1, timeout=timeout_s * (1 + max(shares)) + 30)

    def worker(i: int) -> None:
        client = None
        try:
            client = InferenceClient(url, protocol, timeout_s)
            for _ in range(warmups[i]):
                client.infer(model, inputs, output_names)
        except BaseException as e:  # reported by the main thread
            errors.append(e)
        try:
            ready.wait()
            if not errors:
                for _ in range(shares[i]):
                    start = time.perf_counter()
                    client.infer(model, inputs, output_names)
                    end = time.perf_counter()
                    latencies[i].append(end - start)
                    spans[i].extend((start, end))
        except threading.BrokenBarrierError:
            pass
        except BaseException as e:
            errors.append(e)
        finally:
            if client is not None:
                client.close()
            try:
                done.wait()
            except threading.BrokenBarrierError:
                pass

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    try:
        ready.wait()
        done.wait()
        times = [t for span in spans for t in span]
        wall = max(times) - min(times) if times else float("nan")
    except threading.BrokenBarrierError:
        wall = float("nan")
    for t in threads:
        t.join(timeout=timeout_s + 5)
    if errors:
        first = errors[0]
        raise first if isinstance(first, ServingError) else ServingError(f"latency run against {url}: {first}")
    if any(t.is_alive() for t in threads) or not np.isfinite(wall):
        raise ServingError(f"latency run against {url} ({protocol}), model {model!r}: a client thread did not finish")
    return [x for per_thread in latencies for x in per_thread], wall


def measure_latency(url: str, protocol: str, model: str, make_inputs: MakeInputs, output_names: Sequence[str],
                    batch_sizes: Sequence[int], concurrencies: Sequence[int], *, num_requests: int = 100,
                    warmup_requests: int = 10, timeout_s: float = 30.0, verbose: bool = True) -> List[dict]:
    """Measure every (batch size, concurrency) pair.

    Args:
        url, protocol, model: the server ("host:port"), "grpc" or "http", and the model name.
        make_inputs: batch size -> {input name: array with that many rows}; called once per batch size (the same
            request is sent repeatedly, so the figures measure serving, not input generation).
        output_names: outputs to request.
        num_requests: timed requests per pair (over all threads); warmup_requests: untimed ones before.
        timeout_s: limit of each request.
    Returns: one record per pair: {"batch_size", "concurrency", "requests", "protocol", "model",
    "throughput_samples_per_s", "throughput_requests_per_s", "latency_ms": {"mean", "p50", "p90", "p95", "p99"}}.
    """
    if num_requests < 1 or warmup_requests < 0:
        raise ValueError(f"num_requests must be >= 1 and warmup_requests >= 0, got {num_requests}, {warmup_requests}")
    if not batch_sizes or min(batch_sizes) < 1 or not concurrencies or min(concurrencies) < 1:
        raise ValueError(f"batch sizes and concurrencies must be non-empty and >= 1, got {list(batch_sizes)}, "
                         f"{list(concurrencies)}")
    records = []
    for batch_size in batch_sizes:
        inputs = {name: np.ascontiguousarray(a) for name, a in make_inputs(int(batch_size)).items()}
        rows = {name: len(a) for name, a in inputs.items()}
        if set(rows.values()) != {batch_size}:
            raise ValueError(f"make_inputs({batch_size}) returned row counts {rows}; expected {batch_size} each")
        for concurrency in concurrencies:
            latencies, wall = _run_level(url, protocol, model, inputs, output_names, int(concurrency),
                                         int(max(num_requests, concurrency)), int(warmup_requests), timeout_s)
            record = {"batch_size": int(batch_size), "concurrency": int(concurrency), "requests": len(latencies),
                      "protocol": protocol, "model": model,
                      "throughput_samples_per_s": len(latencies) * batch_size / wall,
                      "throughput_requests_per_s": len(latencies) / wall,
                      "latency_ms": _summary_ms(latencies)}
            records.append(record)
            if verbose:
                print(format_record(record), flush=True)
    return records


def format_record(record: dict) -> str:
    lat = record["latency_ms"]
    return (f"batch {record['batch_size']:>6}  concurrency {record['concurrency']:>3}  "
            f"{record['throughput_samples_per_s']:>12,.0f} samples/s  p50 {lat['p50']:8.2f} ms  "
            f"p90 {lat['p90']:8.2f} ms  p95 {lat['p95']:8.2f} ms  p99 {lat['p99']:8.2f} ms")


def write_latency_report(records: Sequence[dict], json_path: Optional[str], png_path: Optional[str],
                         title: str) -> None:
    """Write ``{"title", "date", "cpu", "cpu_count", "records": [...]}`` to ``json_path`` (atomically; an existing
    non-JSON file is refused) and a PNG to ``png_path``: p50 (solid) and p99 (dashed) latency and throughput against
    batch size, one line per concurrency. Either path may be None (not written)."""
    if json_path:
        check_json_output(json_path)
        report = {"title": title, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  "cpu": _cpu_model(), "cpu_count": os.cpu_count(), "records": list(records)}
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        atomic_write_text(json_path, json.dumps(report, indent=2) + "\n")
    if png_path:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, (ax_lat, ax_tput) = plt.subplots(1, 2, figsize=(11, 4.2))
        for concurrency in sorted({r["concurrency"] for r in records}):
            rows = sorted((r for r in records if r["concurrency"] == concurrency), key=lambda r: r["batch_size"])
            x = [r["batch_size"] for r in rows]
            line, = ax_lat.plot(x, [r["latency_ms"]["p50"] for r in rows], marker="o",
                                label=f"p50, concurrency {concurrency}")
            ax_lat.plot(x, [r["latency_ms"]["p99"] for r in rows], marker="x", linestyle="--", color=line.get_color(),
                        label=f"p99, concurrency {concurrency}")
            ax_tput.plot(x, [r["throughput_samples_per_s"] for r in rows], marker="o",
                         label=f"concurrency {concurrency}")
        for ax, ylabel in ((ax_lat, "latency (ms)"), (ax_tput, "throughput (samples/s)")):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("batch size")
            ax.set_ylabel(ylabel)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(png_path)), exist_ok=True)
        with atomic_path(png_path) as tmp:
            fig.savefig(tmp, format="png", dpi=100)
        plt.close(fig)


def add_latency_arguments(parser: argparse.ArgumentParser, *, default_model_name: Optional[str] = None,
                          default_batch_sizes: Sequence[int] = (1, 16, 256, 1024),
                          default_concurrency: Sequence[int] = (1, 2)) -> argparse.ArgumentParser:
    """Add the shared ``evaluate_latency`` flags: --server-url --protocol --model-name --batch-sizes --concurrency
    --num-requests --warmup-requests --timeout --output-json --output-png (each also with underscores: ``--server_url``,
    as the seed's ``evaluate_accuracy`` spells it; ``recsys_common.flags``). Returns the parser."""
    add_flag(parser, "--server-url", default="127.0.0.1:8001",
             help="host:port of the server (Triton: 8001 gRPC, 8000 HTTP)")
    add_flag(parser, "--protocol", choices=["grpc", "http"], default="grpc", help="KServe-v2 protocol")
    add_flag(parser, "--model-name", default=default_model_name, required=default_model_name is None,
             help="served model name")
    add_flag(parser, "--batch-sizes", type=int, nargs="+", default=list(default_batch_sizes),
             help="rows per request")
    add_flag(parser, "--concurrency", type=int, nargs="+", default=list(default_concurrency),
             help="concurrent clients (one thread each)")
    add_flag(parser, "--num-requests", type=int, default=100, help="timed requests per batch size and concurrency")
    add_flag(parser, "--warmup-requests", type=int, default=10, help="untimed requests before each measurement")
    add_flag(parser, "--timeout", type=float, default=30.0, help="seconds allowed per request")
    add_flag(parser, "--output-json", default="latency.json", help="JSON report (written atomically)")
    add_flag(parser, "--output-png", default=None, help="PNG plot of throughput and latency (none unless given)")
    add_flag(parser, "--perf-analyzer", action="store_true",
             help="also run Triton's perf_analyzer on each batch size and concurrency (same request rows, "
                  "back to back) and report both tools' throughput side by side")
    add_flag(parser, "--perf-analyzer-rounds", type=int, default=2,
             help="with --perf-analyzer: turns each tool takes per batch size (each keeps its best)")
    add_flag(parser, "--perf-analyzer-interval-ms", type=int, default=500,
             help="with --perf-analyzer: perf_analyzer's measurement window (--measurement-interval)")
    return parser


def compare_with_perf_analyzer(url: str, protocol: str, model: str, make_inputs: MakeInputs,
                               output_names: Sequence[str], batch_sizes: Sequence[int],
                               concurrencies: Sequence[int], *, num_requests: int = 100, warmup_requests: int = 10,
                               timeout_s: float = 30.0, measurement_interval_ms: int = 500, rounds: int = 2,
                               perf_timeout_s: float = 120.0) -> List[dict]:
    """Our ``measure_latency`` and perf_analyzer back to back on each (batch size, concurrency), same request data.

    ``rounds``: the two tools take turns this many times per batch size and each keeps its best throughput (on a
    shared machine a burst of load during one tool's turn would otherwise decide the comparison).
    Returns one record per pair: ours (``measure_latency``'s record of our best round) with ``"perf_analyzer"`` =
    perf_analyzer's best record for the pair, ``"rounds"``, and ``"throughput_ratio"`` = ours / perf_analyzer's
    samples per second.
    """
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    best = lambda a, b: b if a is None or b["throughput_samples_per_s"] > a["throughput_samples_per_s"] else a  # noqa
    records = []
    for batch_size in batch_sizes:
        inputs = {n: np.ascontiguousarray(a) for n, a in make_inputs(int(batch_size)).items()}
        fixed = (lambda _b, _i=inputs: _i)   # both tools send the very same rows
        ours: Dict[int, dict] = {}
        theirs: Dict[int, dict] = {}
        for _ in range(rounds):
            for r in measure_latency(url, protocol, model, fixed, output_names, [batch_size], concurrencies,
                                     num_requests=num_requests, warmup_requests=warmup_requests, timeout_s=timeout_s,
                                     verbose=False):
                ours[r["concurrency"]] = best(ours.get(r["concurrency"]), r)
            for r in run_perf_analyzer(url, protocol, model, fixed, batch_size, concurrencies,
                                       measurement_interval_ms=measurement_interval_ms, timeout_s=perf_timeout_s):
                theirs[r["concurrency"]] = best(theirs.get(r["concurrency"]), r)
        for concurrency in sorted(ours):
            record, other = ours[concurrency], theirs[concurrency]
            records.append(dict(record, perf_analyzer=other, rounds=rounds,
                                throughput_ratio=record["throughput_samples_per_s"] /
                                other["throughput_samples_per_s"]))
    return records


def perf_analyzer_options(args: argparse.Namespace) -> Dict[str, object]:
    """``run_latency``'s perf_analyzer keyword arguments from the flags ``add_latency_arguments`` adds."""
    return {"perf_analyzer": bool(args.perf_analyzer), "perf_analyzer_rounds": int(args.perf_analyzer_rounds),
            "perf_analyzer_interval_ms": int(args.perf_analyzer_interval_ms)}


def run_latency(*, server_url: str, protocol: str, model_name: str, batch_sizes: Sequence[int],
                concurrency: Sequence[int], num_requests: int, warmup_requests: int, timeout_s: float,
                output_json: Optional[str], output_png: Optional[str], make_inputs: MakeInputs,
                output_names: Sequence[str], title: Optional[str] = None, wait_ready_s: float = 30.0,
                perf_analyzer: bool = False, perf_analyzer_rounds: int = 2,
                perf_analyzer_interval_ms: int = 500) -> List[dict]:
    """Check the outputs are writable, wait for the model, measure, print one line per pair, write the report.

    ``perf_analyzer``: measure each pair with Triton's perf_analyzer too (:func:`compare_with_perf_analyzer`);
    each record then holds ``"perf_analyzer"`` (its figures) and ``"throughput_ratio"`` (ours / perf_analyzer's)."""
    check_json_output(output_json)
    with InferenceClient(server_url, protocol, timeout_s) as client:
        client.wait_until_ready(model_name, timeout_s=wait_ready_s)
    if perf_analyzer:
        find_perf_analyzer()   # before measuring anything
        records = compare_with_perf_analyzer(server_url, protocol, model_name, make_inputs, output_names,
                                             batch_sizes, concurrency, num_requests=num_requests,
                                             warmup_requests=warmup_requests, timeout_s=timeout_s,
                                             rounds=perf_analyzer_rounds,
                                             measurement_interval_ms=perf_analyzer_interval_ms)
        for record in records:
            print(format_comparison(record), flush=True)
    else:
        records = measure_latency(server_url, protocol, model_name, make_inputs, output_names, batch_sizes,
                                  concurrency, num_requests=num_requests, warmup_requests=warmup_requests,
                                  timeout_s=timeout_s)
    write_latency_report(records, output_json, output_png,
                         title or f"{model_name} via {protocol} at {server_url} ({_cpu_model()})")
    return records
