"""Benchmark: peak memory and speed of ``recsys_common.transcode`` at several input sizes, printed as JSON.

    python common/benchmarks/transcode.py --rows 500000,2000000 --chunk_size 65536

For each size: ``gen_csv`` writes a bring-your-own CSV dataset (label, 4 numericals, 4 one-hot features of which two
``cardinality: auto``, multi-hot features of max_hotness 3 and 10 as list cells) into a temporary directory; then a
fresh child process runs the transcoder on it (``--format``, default split_binary) and reports its own peak RSS
(``VmHWM``). Memory bounded by ``--chunk_size`` shows as a peak that stays flat while the input grows; the JSON
has the peaks side by side and their ratio, with the input sizes, rows/s, CPU model and load average.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from recsys_common.dataset_tools import generate_csv
from recsys_common.machine import cpu_model_name

HERE = os.path.dirname(os.path.abspath(__file__))
COMMON = os.path.dirname(HERE)
sys.path.insert(0, COMMON)

SPEC = {
    "feature_spec": {"label": {"dtype": "int8"},
                     **{f"num_{i}": {"dtype": "float32"} for i in range(4)},
                     "cat_0": {"cardinality": "auto"}, "cat_1": {"cardinality": "auto"},
                     "cat_2": {"cardinality": 5000}, "cat_3": {"cardinality": 40},
                     "tags": {"cardinality": 1000, "max_hotness": 3},
                     "history": {"cardinality": 100000, "max_hotness": 10}},
    "channel_spec": {"label": ["label"], "numerical": [f"num_{i}" for i in range(4)],
                     "categorical": ["cat_0", "cat_1", "cat_2", "cat_3", "tags", "history"]},
    "source_spec": {"train": [{"type": "csv", "files": ["train.csv"],
                               "features": ["label", "num_0", "num_1", "num_2", "num_3", "cat_0", "cat_1", "cat_2",
                                            "cat_3", "tags", "history"]}]},
    "metadata": {},
}

# The child's peak is its VmHWM (high-water RSS of its own address space). Not ru_maxrss: Linux carries into it the
# RSS the process had before exec, i.e. this parent's at fork time, which grows with the CSV just generated.
CHILD = """
import sys, time
sys.path.insert(0, {common!r})
from recsys_common.transcode import main
t0 = time.perf_counter()
main({argv!r})
hwm = [line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
print("RESULT", time.perf_counter() - t0, hwm)
"""


def run_size(rows: int, chunk_size: int, fmt: str, workdir: str) -> dict:
    import yaml
    spec_path = os.path.join(workdir, "spec.yaml")
    with open(spec_path, "w") as f:
        yaml.safe_dump(SPEC, f)
    csv_dir, out_dir = os.path.join(workdir, f"csv_{rows}"), os.path.join(workdir, f"out_{rows}")
    with open(os.devnull, "w") as quiet:
        stdout, sys.stdout = sys.stdout, quiet
        try:
            generate_csv(spec_path, csv_dir, rows)
        finally:
            sys.stdout = stdout
    csv_bytes = os.path.getsize(os.path.join(csv_dir, "train.csv"))
    argv = ["--input", csv_dir, "--output", out_dir, "--format", fmt, "--chunk_size", str(chunk_size)]
    proc = subprocess.run([sys.executable, "-c", CHILD.format(common=COMMON, argv=argv)], capture_output=True,
                          text=True, check=True)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT")][-1].split()
    seconds, peak_kb = float(line[1]), int(line[2])
    return {"rows": rows, "csv_mib": round(csv_bytes / 2**20, 1), "seconds": round(seconds, 2),
            "rows_per_s": round(rows / seconds), "peak_rss_mib": round(peak_kb / 1024, 1)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="500000,2000000", help="comma-separated input sizes (rows)")
    p.add_argument("--chunk_size", type=int, default=65536)
    p.add_argument("--format", choices=["split_binary", "parquet"], default="split_binary")
    p.add_argument("--workdir", default=None, help="scratch directory (default: a temporary one, removed after)")
    args = p.parse_args(argv)
    sizes = [int(x) for x in args.rows.split(",") if x.strip()]
    with tempfile.TemporaryDirectory(dir=args.workdir) as workdir:
        results = [run_size(n, args.chunk_size, args.format, workdir) for n in sizes]
    report = {"benchmark": "recsys_common.transcode peak memory vs input size", "format": args.format,
              "chunk_size": args.chunk_size, "sizes": results,
              "peak_ratio_largest_to_smallest": round(results[-1]["peak_rss_mib"] / results[0]["peak_rss_mib"], 3),
              "input_ratio_largest_to_smallest": round(results[-1]["rows"] / results[0]["rows"], 3),
              "cpu": cpu_model_name(), "loadavg_1min": os.getloadavg()[0],
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    print(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    main()
