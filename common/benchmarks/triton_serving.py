"""Benchmark: each recipe's CPU repository on the real Triton server, measured by our client and by perf_analyzer.

    python common/benchmarks/triton_serving.py --output serving.json \\
        --case dlrm=PYTHON_REPO:dlrm-onnx --case ncf=... [--batch-sizes 1 64 1024] [--concurrency 1 4]

A case names one model of a CPU repository (``deploy.py --triton-backend python``), served by ``tritonserver``
through ``triton_server``. On random valid rows (from the model's sidecar) each (batch size, concurrency) is measured
by our client (``latency.measure_latency``, what ``evaluate_latency`` runs) and by Triton's ``perf_analyzer``, taking
turns (``compare_with_perf_analyzer``); the machine's load average is recorded before each case.

The MLServer stand-in this project served with before Triton ran here is retired: at commit a2f23de this script also
served each native repository on MLServer in the same run (``git checkout a2f23de``, then ``bash
common/benchmarks/triton_serving.sh OUT`` reproduces that comparison; common/RESULTS.md has its figures).

The JSON: ``{"cases": {name: {"triton": [records]}}, "cpu", "date", "command", ...}``; each record has
``batch_size``, ``concurrency``, ``throughput_samples_per_s``, ``latency_ms`` (p50 ... p99) and ``perf_analyzer`` (the
same figures from perf_analyzer). A table is printed too.
"""
import argparse
import datetime
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from recsys_common.machine import cpu_model_name  # noqa: E402


def parse_case(text: str):
    name, _, rest = text.partition("=")
    parts = rest.split(":")
    if not name or len(parts) != 2 or not all(parts):
        raise argparse.ArgumentTypeError(f"--case wants NAME=PYTHON_REPO:MODEL, got {text!r}")
    return name, parts[0], parts[1]


def measure_case(python_repo, model, args):
    from recsys_common.serving.latency import compare_with_perf_analyzer, measure_latency
    from recsys_common.serving.repository import read_sidecar
    from recsys_common.serving.rows import sidecar_row_maker
    outputs = read_sidecar(os.path.join(python_repo, model))["outputs"]
    from recsys_common.serving.triton_server import serve_repository
    results = {}
    for server, repository in (("triton", python_repo),):
        make_inputs = sidecar_row_maker(python_repo, model, seed=0)
        with serve_repository(repository, [model], startup_timeout_s=300) as handle:
            load = os.getloadavg()[0]
            if args.no_perf_analyzer:
                records = measure_latency(handle.grpc_url, "grpc", model, make_inputs, outputs, args.batch_sizes,
                                          args.concurrency, num_requests=args.requests, verbose=False)
            else:
                records = compare_with_perf_analyzer(handle.grpc_url, "grpc", model, make_inputs, outputs,
                                                     args.batch_sizes, args.concurrency,
                                                     num_requests=args.requests, rounds=args.rounds)
        results[server] = [dict(r, load_average_before=load) for r in records]
    return results


def table(report) -> str:
    lines = [f"{'case':<10} {'server':<9} {'batch':>5} {'conc':>4} {'ours/s':>10} {'p50 ms':>8} {'p99 ms':>8} "
             f"{'perf_an/s':>10}"]
    for name, servers in report["cases"].items():
        for server, records in servers.items():
            for r in records:
                pa = r.get("perf_analyzer", {}).get("throughput_samples_per_s")
                lines.append(f"{name:<10} {server:<9} {r['batch_size']:>5} {r['concurrency']:>4} "
                             f"{r['throughput_samples_per_s']:>10.0f} {r['latency_ms']['p50']:>8.2f} "
                             f"{r['latency_ms']['p99']:>8.2f} {pa if pa is None else round(pa):>10}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--case", type=parse_case, action="append", required=True,
                   help="NAME=PYTHON_REPO:MODEL (repeatable)")
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64, 1024])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 4])
    p.add_argument("--requests", type=int, default=100, help="requests per measurement of our client")
    p.add_argument("--rounds", type=int, default=1, help="turns each tool takes per batch size (best kept)")
    p.add_argument("--no-perf-analyzer", action="store_true", help="our client only")
    p.add_argument("--output", default=None, help="write the JSON here (default: print only)")
    args = p.parse_args(argv)
    report = {"benchmark": "triton_serving", "cpu": cpu_model_name(), "cores": os.cpu_count(),
              "date": datetime.date.today().isoformat(), "command": " ".join(sys.argv), "cases": {}}
    for name, python_repo, model in args.case:
        print(f"[triton_serving] {name}: {model}", flush=True)
        report["cases"][name] = measure_case(python_repo, model, args)
    print(table(report))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
