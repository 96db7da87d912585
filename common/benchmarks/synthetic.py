"""Benchmark: synthetic Criteo-shaped data generation and the split-binary reader, printed as JSON.

    python common/benchmarks/synthetic.py --rows 1000000 --repeats 3

Generates ``--rows`` rows of a 13-numerical / 26-categorical spec (NVIDIA's split-binary layout) into a temporary
directory, then reads them back in batches; reports the median of ``--repeats`` runs (2-core VMs are noisy).
"""
import argparse
import json
import statistics
import tempfile
import time

from recsys_common.datasets import open_reader
from recsys_common.feature_spec import FeatureSpec
from recsys_common.synthetic import generate_dataset


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=1_000_000, help="rows to generate (default 1M)")
    p.add_argument("--table_size", type=int, default=100_000, help="cardinality of each of the 26 tables")
    p.add_argument("--batch_size", type=int, default=65536, help="reader batch size")
    p.add_argument("--repeats", type=int, default=3, help="runs; the median is reported")
    args = p.parse_args(argv)
    spec = FeatureSpec.get_default_feature_spec(13, [args.table_size] * 26, mappings=("train",))
    gen, read = [], []
    for r in range(args.repeats):
        with tempfile.TemporaryDirectory() as d:
            t0 = time.perf_counter()
            out = generate_dataset(spec, d, {"train": args.rows}, seed=r)
            gen.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            n = sum(len(b["label"]) for b in open_reader(out, "train", batch_size=args.batch_size))
            read.append(time.perf_counter() - t0)
            assert n == args.rows
    result = {"rows": args.rows, "numerical": 13, "categorical": 26, "table_size": args.table_size,
              "generate_s_median": round(statistics.median(gen), 6), "generate_s_all": [round(x, 6) for x in gen],
              "generate_rows_per_s": round(args.rows / statistics.median(gen)),
              "read_s_median": round(statistics.median(read), 6),
              "read_rows_per_s": round(args.rows / statistics.median(read))}
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
