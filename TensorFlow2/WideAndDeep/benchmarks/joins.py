"""Which engine for the Outbrain ETL's big join: ``clicks_train`` ⋈ ``events`` on ``display_id`` (the only join
whose both sides grow with the click log), written to parquet, by three engines. Prints JSON; not a test.

    python benchmarks/joins.py --input_dir /tmp/etl_bench/raw_475059_seed0

- ``buckets``: this ETL's way (:mod:`wide_deep.data.outbrain.joins`): pyarrow block reads cut into display-range
  bucket files, then one pandas merge per bucket (here the typed events are held in memory until bucketed; the ETL
  spills them to disk first, so its memory does not grow with them);
- ``dask``: ``dask.dataframe.read_csv`` (typed, 64 MB blocks) and ``merge`` (hash shuffle), local threaded scheduler;
- ``polars``: ``scan_csv`` + ``join`` + ``sink_parquet`` (Polars' streaming engine).

Each runs in a child process; wall and CPU seconds and the child's peak resident memory (``ru_maxrss``) are
reported with the joined row count, which must agree.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import pyarrow.feather as feather

from recsys_common.machine import cpu_model_name
from wide_deep.data.outbrain.joins import Buckets
from wide_deep.data.outbrain.raw import iter_raw_frames

ENGINES = ("buckets", "dask", "polars")


def _run_engine(engine: str, input_dir: str, out_dir: str, partition_rows: int) -> int:
    clicks, events = (os.path.join(input_dir, f"{n}.csv") for n in ("clicks_train", "events"))
    event_columns = ["display_id", "document_id", "timestamp", "platform", "geo_location"]
    if engine == "buckets":
        ev = list(iter_raw_frames(input_dir, "events", event_columns))
        low = min(int(f["display_id"].min()) for f in ev)
        high = max(int(f["display_id"].max()) for f in ev)
        count = max(1, -(-os.path.getsize(clicks) // 20 // partition_rows))
        width = -(-(high - low + 1) // count)
        cb = Buckets(os.path.join(out_dir, "c"), low, width, count)
        eb = Buckets(os.path.join(out_dir, "e"), low, width, count)
        for f in iter_raw_frames(input_dir, "clicks_train"):
            cb.add(f)
        for f in ev:
            eb.add(f)
        del ev
        rows = 0
        for b in range(count):
            c, e = cb.read(b), eb.read(b)
            if c is None or e is None:
                continue
            df = c.merge(e, on="display_id", how="inner")
            feather.write_feather(df, os.path.join(out_dir, f"joined_{b}.arrow"))
            rows += len(df)
        return rows
    if engine == "dask":
        import dask   # late on purpose, as polars below: each engine's child imports only its own
        import dask.dataframe as dd
        dask.config.set(scheduler="threads")
        c = dd.read_csv(clicks, dtype={"display_id": "int64", "ad_id": "int64", "clicked": "int64"}, blocksize="64MB")
        e = dd.read_csv(events, usecols=event_columns, blocksize="64MB", na_values=["\\N", ""],
                        keep_default_na=False,
                        dtype={"display_id": "int64", "document_id": "int64", "timestamp": "int64",
                               "platform": "float64", "geo_location": "object"})
        c.merge(e, on="display_id", how="inner").to_parquet(os.path.join(out_dir, "joined"), write_index=False)
        return int(dd.read_parquet(os.path.join(out_dir, "joined")).shape[0].compute())
    if engine == "polars":
        import polars as pl
        c = pl.scan_csv(clicks, schema_overrides={"display_id": pl.Int64, "ad_id": pl.Int64, "clicked": pl.Int64})
        e = pl.scan_csv(events, null_values=["\\N", ""],
                        schema_overrides={"display_id": pl.Int64, "uuid": pl.Utf8, "document_id": pl.Int64,
                                          "timestamp": pl.Int64, "platform": pl.Float64,
                                          "geo_location": pl.Utf8}).select(event_columns)
        path = os.path.join(out_dir, "joined.parquet")
        c.join(e, on="display_id", how="inner").sink_parquet(path)
        return int(pl.scan_parquet(path).select(pl.len()).collect().item())
    raise ValueError(engine)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input_dir", required=True, help="raw Outbrain CSVs (the generator's)")
    p.add_argument("--engines", nargs="+", default=list(ENGINES), choices=ENGINES)
    p.add_argument("--partition_rows", type=int, default=1_000_000)
    p.add_argument("--engine", default=None, help=argparse.SUPPRESS)   # child mode
    p.add_argument("--out_dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.engine:
        start = time.perf_counter()
        rows = _run_engine(args.engine, args.input_dir, args.out_dir, args.partition_rows)
        usage = resource.getrusage(resource.RUSAGE_SELF)
        print(json.dumps({"engine": args.engine, "joined_rows": rows, "seconds": round(time.perf_counter() - start, 1),
                          "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 1),
                          "peak_rss_gb": round(usage.ru_maxrss * 1024 / 1e9, 3)}))
        return 0
    results = []
    for engine in args.engines:
        out_dir = tempfile.mkdtemp(prefix=f"join_{engine}_")
        try:
            run = subprocess.run([sys.executable, os.path.abspath(__file__), "--input_dir",
                                  args.input_dir, "--engine", engine, "--out_dir", out_dir, "--partition_rows",
                                  str(args.partition_rows)], capture_output=True, text=True, check=True)
            results.append(json.loads(run.stdout.strip().splitlines()[-1]))
            results[-1]["load_average_1min_after"] = os.getloadavg()[0]
            print(json.dumps(results[-1]), flush=True)
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)
    print(json.dumps({"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
                      "cpu_model": cpu_model_name(), "cpus": os.cpu_count(), "input_dir": args.input_dir,
                      "runs": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
