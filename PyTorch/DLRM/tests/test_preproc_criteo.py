"""preproc/prepare_dataset.sh and the preproc README, around the shared Criteo job (tested in common/tests)."""
import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from recsys_common.datasets import open_reader, read_columns
from recsys_testing import shared_data_path

from conftest import load_benchmark
from preproc import logistic_baseline, movielens_ctr

benchmark_preprocess = load_benchmark("preprocess")

PREPROC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "preproc")
SCRIPT = os.path.join(PREPROC, "prepare_dataset.sh")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(PREPROC)))


def run_script(args, env_overrides, timeout=600):
    env = {k: v for k, v in os.environ.items()
           if k not in ("INPUT_PATH", "OUTPUT_PATH", "BINARY_PATH", "SPARK_LOCAL_DIRS", "FREQUENCY_LIMIT",
                        "TOTAL_CORES", "TOTAL_MEMORY", "SPARK_MASTER", "PREPROC_CONFIG", "OVERWRITE",
                        "SPARK_PREPROCESS_ARGS", "PREPROC_ENGINE", "PREPROC_ARGS", "WORK_DIR")}
    env.update({"PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1",
                "PYTHONPATH": os.path.join(REPO_ROOT, "common") + os.pathsep + env.get("PYTHONPATH", "")})
    env.update(env_overrides)
    return subprocess.run(["bash", SCRIPT, *args], env=env, capture_output=True, text=True, timeout=timeout)


def paths(tmp_path, input_path):
    return {"INPUT_PATH": str(input_path), "OUTPUT_PATH": str(tmp_path / "spark"), "BINARY_PATH": str(tmp_path / "bin"),
            "SPARK_LOCAL_DIRS": str(tmp_path / "scratch"), "TOTAL_CORES": "2", "TOTAL_MEMORY": "1"}


# ------------------------------------------------------------------------------------------- argument errors
@pytest.mark.parametrize("args, message", [
    (["15", "GPU"], "GPU Spark (RAPIDS Accelerator) is not packaged"),
    (["15", "CPU", "NVTabular"], "third argument (or PREPROC_ENGINE) must be Polars or Spark"),
    (["fifteen"], "FREQUENCY_LIMIT must be a non-negative integer"),
])
def test_prepare_dataset_rejects_unsupported_arguments(tmp_path, args, message):
    result = run_script(args, paths(tmp_path, tmp_path))
    assert result.returncode == 2 and message in result.stderr
    assert not (tmp_path / "bin").exists()


def test_prepare_dataset_verifies_input_first(tmp_path):
    days = tmp_path / "criteo"
    days.mkdir()
    for day in (0, 1, 3):
        (days / f"day_{day}").write_text("0\t1\n")
    result = run_script([], paths(tmp_path, days))
    assert result.returncode == 2 and "day_2 is missing" in result.stderr
    (days / "day_2").write_text("")
    result = run_script([], paths(tmp_path, days))
    assert result.returncode == 2 and "day_2 is empty" in result.stderr
    (days / "day_2").write_text("0\t1\n")
    (days / "day_2.gz").write_text("")
    result = run_script([], paths(tmp_path, days))
    assert result.returncode == 2 and "day 2 is present twice" in result.stderr
    assert not (tmp_path / "spark").exists()


def test_prepare_dataset_passes_input_format_flags_to_the_spark_job(tmp_path):
    """SPARK_PREPROCESS_ARGS reaches spark_preprocess word by word (a stand-in interpreter records the call)."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "train.txt").write_text("label,I1\n0,1.0\n")
    recorded = tmp_path / "argv.txt"
    shim = tmp_path / "python"
    shim.write_text(f"""#!/usr/bin/env bash
if [[ "${{2:-}}" == recsys_common.criteo.spark_preprocess ]]; then printf '%s\\n' "$@" > {recorded}; exit 7; fi
exec {sys.executable} "$@"
""")
    shim.chmod(0o755)
    env = paths(tmp_path, tmp_path / "in")
    env.update({"PYTHON": str(shim), "SPARK_PREPROCESS_ARGS": "--header yes --delimiter comma"})
    result = run_script(["3", "CPU", "Spark"], env)
    assert result.returncode == 7, result.stderr
    argv = recorded.read_text().split("\n")
    assert argv[argv.index("--header") + 1] == "yes" and argv[argv.index("--delimiter") + 1] == "comma"
    assert argv[argv.index("--frequency_limit") + 1] == "3"


# ------------------------------------------------------------------------------------------- conversion step alone
def fake_spark_output(directory, rows, frequency_limit=15):
    """What spark_preprocess writes, made with pyarrow: lets the shell pipeline be tested without a JVM."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(0)
    cards = [3 + i for i in range(26)]
    written = {}
    for split, n in rows.items():
        os.makedirs(os.path.join(directory, split))
        table = {"label": pa.array(rng.integers(0, 2, n).astype(np.int8))}
        for i in range(13):
            table[f"num_{i}"] = pa.array(rng.random(n).astype(np.float32))
        for i in range(26):
            table[f"cat_{i}"] = pa.array(rng.integers(0, cards[i], n).astype(np.int32))
        half = n // 2   # two part files: their name order is row order
        full = pa.table(table)
        pq.write_table(full.slice(0, half), os.path.join(directory, split, "part-00000-x.c000.snappy.parquet"))
        pq.write_table(full.slice(half), os.path.join(directory, split, "part-00001-x.c000.snappy.parquet"))
        written[split] = full
    with open(os.path.join(directory, "cardinalities.json"), "w") as f:
        json.dump(cards, f)
    with open(os.path.join(directory, "preprocess_report.json"), "w") as f:
        json.dump({"frequency_limit": frequency_limit, "input": {"kind": "kaggle"}, "rows_written": rows,
                   "rows_malformed": {s: {} for s in rows}}, f)
    return cards, written


def test_prepare_dataset_reuses_finished_spark_output(tmp_path):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "train.txt").write_text("0\t1\n")
    env = paths(tmp_path, tmp_path / "in")
    cards, written = fake_spark_output(env["OUTPUT_PATH"], {"train": 300, "test": 50, "validation": 40})
    result = run_script(["15", "CPU", "Spark"], env)
    assert result.returncode == 0, result.stderr
    assert "skipping the Spark job" in result.stdout
    from recsys_common.feature_spec import FeatureSpec
    spec = FeatureSpec.from_yaml(os.path.join(env["BINARY_PATH"], "feature_spec.yaml"))
    assert [spec.cardinality(f"cat_{i}.bin") for i in range(26)] == cards
    for split, table in written.items():
        columns = read_columns(spec, split)
        np.testing.assert_array_equal(columns["label"], table.column("label").to_numpy().astype(bool))
        np.testing.assert_array_equal(columns["cat_25.bin"], table.column("cat_25").to_numpy())
        np.testing.assert_allclose(columns["num_3"].astype(np.float32), table.column("num_3").to_numpy(), atol=1e-3)
    # a finished run with another frequency limit is not silently reused
    result = run_script(["3"], {**env, "SPARK_MASTER": "local[2]"})     # SPARK_MASTER set: Spark by default
    assert result.returncode == 2 and "holds a run with frequency limit 15" in result.stderr


@pytest.mark.slow
def test_prepare_dataset_end_to_end_on_real_kaggle_rows(tmp_path):
    """The whole script with a real Spark job: 1,999 real rows as Kaggle's train.txt, then the baseline on it."""
    (tmp_path / "in").mkdir()
    os.symlink(shared_data_path("criteo", "kaggle-train-head1999.tsv"), tmp_path / "in" / "train.txt")
    env = paths(tmp_path, tmp_path / "in")
    # C1-only JIT: the job is tiny, JVM warm-up dominates
    env["SPARK_PREPROCESS_ARGS"] = ("--shuffle_partitions 2 "
                                    "--spark_conf spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1")
    result = run_script(["3", "CPU", "Spark"], env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.load(open(os.path.join(env["OUTPUT_PATH"], "preprocess_report.json")))
    assert report["rows_written"] == {"train": 1714, "test": 143, "validation": 142}
    from recsys_common.feature_spec import FeatureSpec
    spec = FeatureSpec.from_yaml(os.path.join(env["BINARY_PATH"], "feature_spec.yaml"))
    assert open_reader(spec, "test", batch_size=64).num_samples == 143
    auc = logistic_baseline.main(["--dataset", env["BINARY_PATH"]])
    assert 0.6 < auc < 0.8          # measured 0.695 on these 143 test rows (frequency limit 3)


def test_prepare_dataset_default_engine_is_polars_end_to_end(tmp_path):
    """The default engine (no JVM): 1,999 real rows as Kaggle's train.txt -> split binary in one step, then the
    logistic baseline on it; the same AUC as the Spark path's run above (same rows, same dataset bytes)."""
    (tmp_path / "in").mkdir()
    os.symlink(shared_data_path("criteo", "kaggle-train-head1999.tsv"), tmp_path / "in" / "train.txt")
    env = paths(tmp_path, tmp_path / "in")
    result = run_script(["3"], env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "engine=polars" in result.stdout and "pass 2/2 (map and write)" in result.stdout
    assert not (tmp_path / "spark").exists() and not os.path.exists(env["BINARY_PATH"] + ".work")
    report = json.load(open(os.path.join(env["BINARY_PATH"], "preprocess_report.json")))
    assert report["rows_written"] == {"train": 1714, "test": 143, "validation": 142}
    from recsys_common.feature_spec import FeatureSpec
    spec = FeatureSpec.from_yaml(os.path.join(env["BINARY_PATH"], "feature_spec.yaml"))
    assert open_reader(spec, "test", batch_size=64).num_samples == 143
    auc = logistic_baseline.main(["--dataset", env["BINARY_PATH"]])
    assert 0.6 < auc < 0.8
    # a second run refuses the finished dataset unless OVERWRITE=1
    again = run_script(["3"], env)
    assert again.returncode == 2 and "not empty" in again.stderr
    assert run_script(["3"], {**env, "OVERWRITE": "1"}).returncode == 0


# ------------------------------------------------------------------------------------------- README vs parsers
def _readme_table(title):
    text = open(os.path.join(PREPROC, "README.md"), encoding="utf-8").read()
    start = text.index(title)
    rows = {}
    for line in text[start:].split("\n")[1:]:
        if line.startswith("| `--"):
            flag, default = re.match(r"\| `(--\w+)` \| ([^|]*) \|", line).groups()
            rows[flag] = default.strip()
        elif rows and not line.startswith("|"):
            break
    return rows


def _parser_table(parser):
    rows = {}
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        default = action.default
        if action.required:
            default = "required"
        elif isinstance(action, argparse._StoreTrueAction):
            default = "off"
        elif isinstance(default, list):
            default = " ".join(default) if default else "none"
        rows[action.option_strings[-1]] = "none" if default is None else str(default)
    return rows


@pytest.mark.parametrize("title, parser_factory", [
    ("### `python -m recsys_common.criteo.spark_preprocess` flags", "spark_preprocess"),
    ("### `python -m recsys_common.criteo.to_split_binary` flags", "to_split_binary"),
    ("### `python -m recsys_common.criteo.polars_preprocess` flags", "polars_preprocess"),
    ("## MovieLens-1M as a CTR dataset", "movielens"),
    ("## Logistic-regression baseline", "baseline"),
    ("### Benchmark", "benchmark"),
])
def test_readme_flag_tables_match_parsers(title, parser_factory, monkeypatch):
    for name in ("INPUT_PATH", "OUTPUT_PATH", "FREQUENCY_LIMIT", "SPARK_MASTER", "TOTAL_CORES", "TOTAL_MEMORY",
                 "SPARK_LOCAL_DIRS", "BINARY_PATH"):
        monkeypatch.delenv(name, raising=False)
    from recsys_common.criteo import polars_preprocess, spark_preprocess, to_split_binary
    parser = {"spark_preprocess": spark_preprocess.build_parser, "to_split_binary": to_split_binary.build_parser,
              "polars_preprocess": polars_preprocess.build_parser,
              "movielens": movielens_ctr.build_parser, "baseline": logistic_baseline.build_parser,
              "benchmark": benchmark_preprocess.build_parser}[parser_factory]()
    assert _readme_table(title) == _parser_table(parser)


def test_benchmark_generates_criteo_shaped_rows(tmp_path):
    path = str(tmp_path / "train.txt")
    benchmark_preprocess.write_raw(path, 500, seed=1, block=128)
    lines = open(path).read().split("\n")[:-1]
    assert len(lines) == 500
    fields = [line.split("\t") for line in lines]
    assert all(len(f) <= 40 for f in fields) and sum(len(f) < 40 for f in fields) >= 1   # some stripped rows
    assert {f[0] for f in fields} == {"0", "1"}
    assert all(x == "" or int(x) >= 0 for f in fields for x in f[1:14])
    assert all(x == "" or re.fullmatch(r"[0-9a-f]{8}", x) for f in fields for x in f[14:])


def test_benchmark_peer_writes_the_same_dataset_as_ours_in_input_order(tmp_path):
    """The repository's plain Polars peer (benchmarks/criteo_polars_peer.py, the benchmark's default --peer_script)
    does the same work as our engine with --train_ordering input: every .bin file byte for byte, and the same
    FeatureSpec but for our engine's metadata. So the rows/s ratio compares two ways of writing one dataset."""
    import yaml
    result = benchmark_preprocess.main(["--rows", "3000", "--frequency_limit", "3", "--engines", "ours_input,peer",
                                        "--work_dir", str(tmp_path)])
    assert set(result["engines"]) == {"ours_input", "peer"} and result["ratios"]["ours_input_vs_peer_rows_per_s"] > 0
    ours, peer = tmp_path / "out_ours_input", tmp_path / "out_peer"
    files = sorted(p.relative_to(ours) for p in ours.rglob("*.bin"))
    assert len(files) == 3 * 28 and sorted(p.relative_to(peer) for p in peer.rglob("*.bin")) == files
    for name in files:
        assert (ours / name).read_bytes() == (peer / name).read_bytes(), name
    spec = [yaml.safe_load(open(d / "feature_spec.yaml")) for d in (ours, peer)]
    without_metadata = [{k: v for k, v in one.items() if k != "metadata"} for one in spec]
    assert without_metadata[0] == without_metadata[1]
