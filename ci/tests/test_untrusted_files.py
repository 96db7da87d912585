"""Files a user hands us may be hostile: a crafted parquet runs no code in any tool that reads a user's parquet.

The attack is CVE-2023-47248 (GHSA-5wvp-7f3h-6wmm, pyarrow 0.14.0 to 14.0.0): a field whose Arrow extension name is
``arrow.py_extension_type`` has its serialized form unpickled when the schema is read, so the file chooses a call
to run. Our crafted file's pickle calls ``open(MARKER, "w")``: the marker file appearing means code from the file
ran. ``test_the_crafted_file_runs_code_in_a_vulnerable_reader`` shows, in the NVTabular environment's pyarrow 12,
that the file really is an exploit (and that importing recsys_common, which loads pyarrow-hotfix there, stops it);
the other tests hand it to every tool of ours that takes a user's parquet: each must either read the plain
columns or stop with an error naming the file, and the marker must never appear.

Also here: the other odd-but-legal inputs the raw-click-log tool meets (dictionary-encoded and pandas-3 string
columns, a CSV with a byte-order mark or mixed line ends): read as the plain file is, or refused naming the file.
"""
import builtins
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from launch_utils import REPO

PYTHON = sys.executable
ROWS = 40


class _OpenMarker:
    """Unpickles to ``open(path, "w")``: creating the file proves the reader ran code chosen by the file."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (builtins.open, (self.path, "w"))


def write_crafted_parquet(path, table: pa.Table, marker) -> None:
    """``table`` written to ``path`` with every field tagged as a pickled Python extension type (the exploit)."""
    payload = pickle.dumps(_OpenMarker(marker))
    fields = [pa.field(f.name, f.type, metadata={b"ARROW:extension:name": b"arrow.py_extension_type",
                                                 b"ARROW:extension:metadata": payload}) for f in table.schema]
    pq.write_table(table.cast(pa.schema(fields)), str(path))


def click_table() -> pa.Table:
    rng = np.random.default_rng(0)
    return pa.table({"click": rng.integers(0, 2, ROWS), "C1": [f"v{i % 5}" for i in range(ROWS)],
                     "n1": rng.normal(size=ROWS)})


def run_tool(args, cwd=None):
    env = dict(os.environ, PYTHONPATH=str(REPO / "common"))
    return subprocess.run([PYTHON, *args], capture_output=True, text=True, timeout=300, cwd=cwd, env=env)


def assert_read_or_refused(proc, path):
    """Exit 0, or a non-zero exit whose error names the file (never a traceback without it)."""
    if proc.returncode != 0:
        assert str(path) in proc.stderr + proc.stdout, proc.stderr[-3000:]


@pytest.fixture
def crafted(tmp_path):
    marker = tmp_path / "MARKER"
    path = tmp_path / "crafted.parquet"
    write_crafted_parquet(path, click_table(), marker)
    yield path, marker
    assert not marker.exists(), "a crafted parquet ran code (CVE-2023-47248)"


def test_the_crafted_file_runs_code_in_a_vulnerable_reader(tmp_path):
    """The test file is a real exploit: pyarrow 12 (the NVTabular environment) runs its pickle on read; once
    ``recsys_common`` is imported (every tool of ours imports it; it loads pyarrow-hotfix under such a pyarrow),
    it does not."""
    from recsys_testing import nvtabular_python
    python = nvtabular_python()
    marker = tmp_path / "MARKER"
    path = tmp_path / "crafted.parquet"
    write_crafted_parquet(path, click_table(), marker)
    read = f"import pyarrow.parquet as pq; pq.read_table({str(path)!r})"
    subprocess.run([python, "-c", read], capture_output=True, text=True, timeout=120)
    assert marker.exists(), "pyarrow 12 did not run the crafted file's pickle: the test file is not an exploit"
    marker.unlink()
    proc = subprocess.run([python, "-c", "import recsys_common; " + read], capture_output=True, text=True,
                          timeout=120)
    assert not marker.exists(), "pyarrow-hotfix did not stop the crafted file"
    assert proc.returncode != 0 and "arrow.py_extension_type" in proc.stderr, proc.stderr[-2000:]


def test_this_pyarrow_reads_the_plain_columns(crafted):
    path, _ = crafted
    table = pq.read_table(path)
    assert table.column_names == ["click", "C1", "n1"] and table.num_rows == ROWS


def test_prepare_clicks_build_and_apply(crafted, tmp_path):
    path, _ = crafted
    flags = ["--label", "click", "--categorical", "C1", "--numerical", "n1"]
    proc = run_tool(["-m", "recsys_common.prepare_clicks", "--input", str(path), "--output", str(tmp_path / "ds"),
                     *flags, "--split_fractions", "0.8", "0.1", "0.1"])
    assert_read_or_refused(proc, path)
    if proc.returncode == 0:
        proc = run_tool(["-m", "recsys_common.prepare_clicks", "apply", "--dataset", str(tmp_path / "ds"),
                         "--input", str(path), "--output", str(tmp_path / "applied")])
        assert_read_or_refused(proc, path)


def test_feature_spec_parquet_reader(crafted):
    from recsys_common.datasets import read_columns
    from recsys_common.feature_spec import FeatureSpec
    path, _ = crafted
    spec = FeatureSpec({"click": {"dtype": "int64"}, "n1": {"dtype": "float64"}},
                       {"train": [{"type": "parquet", "features": ["click", "n1"], "files": [path.name]}]},
                       {"label": ["click"], "numerical": ["n1"]}, base_directory=str(path.parent))
    try:
        columns = read_columns(spec, "train")
    except ValueError as e:
        assert str(path) in str(e)
    else:
        assert len(columns["click"]) == ROWS


def test_criteo_parquet_to_split_binary(tmp_path):
    """The Spark engine's parquet splits -> split binary, given crafted parquet files."""
    from recsys_common.criteo import to_split_binary as tsb
    marker = tmp_path / "MARKER"
    rng = np.random.default_rng(0)
    columns = {tsb.LABEL_COLUMN: rng.integers(0, 2, ROWS).astype(np.int8)}
    columns.update({c: rng.random(ROWS).astype(np.float32) for c in tsb.NUMERICAL_COLUMNS})
    columns.update({c: rng.integers(0, 3, ROWS).astype(np.int32) for c in tsb.CATEGORICAL_COLUMNS})
    for split in ("train", "test", "validation"):
        (tmp_path / "in" / split).mkdir(parents=True)
        write_crafted_parquet(tmp_path / "in" / split / "part-00000.parquet", pa.table(columns), marker)
    (tmp_path / "in" / "cardinalities.json").write_text(json.dumps([3] * len(tsb.CATEGORICAL_COLUMNS)))
    proc = run_tool(["-m", "recsys_common.criteo.to_split_binary", "--input", str(tmp_path / "in"),
                     "--output", str(tmp_path / "out")])
    assert_read_or_refused(proc, tmp_path / "in")
    assert not marker.exists(), "a crafted parquet ran code (CVE-2023-47248)"


_WIDE_DEEP_READERS = """
import sys
from recsys_common.feature_spec import FeatureSpec
from wide_deep.data.loader import ParquetBatches
from deployment.predict import read_table
spec = FeatureSpec.from_yaml(sys.argv[1])
rows = sum(len(labels) for _, labels, _ in ParquetBatches(spec, "train", batch_size=16, shuffle=True))
print("loader rows", rows)
print("predict rows", len(read_table(sys.argv[2])["click"]))
"""


def test_wide_deep_loader_and_predict(crafted, tmp_path):
    """The Wide & Deep parquet loader (training, evaluation) and predict.py's reader, given the crafted file."""
    path, _ = crafted
    spec = tmp_path / "feature_spec.yaml"
    spec.write_text(f"""feature_spec:
  click: {{dtype: int64}}
  C1: {{dtype: int64, cardinality: 10}}
  n1: {{dtype: float64}}
source_spec:
  train:
  - {{type: parquet, features: [click, C1, n1], files: [{path.name}]}}
channel_spec:
  label: [click]
  onehot_categorical: [C1]
  numerical: [n1]
""")
    rng = np.random.default_rng(0)
    write_crafted_parquet(path, pa.table({"click": rng.integers(0, 2, ROWS), "C1": rng.integers(0, 10, ROWS),
                                          "n1": rng.normal(size=ROWS)}), crafted[1])
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "TensorFlow2" / "WideAndDeep"), str(REPO / "common")]),
               TF_USE_LEGACY_KERAS="1", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([PYTHON, "-c", _WIDE_DEEP_READERS, str(spec), str(path)], capture_output=True, text=True,
                          timeout=300, env=env)
    assert_read_or_refused(proc, path)
    if proc.returncode == 0:
        assert f"loader rows {ROWS}" in proc.stdout and f"predict rows {ROWS}" in proc.stdout, proc.stdout


# ------------------------------------------------------------------------------ odd but legal inputs, same result
def _dataset_files(directory):
    return {name: (directory / name).read_bytes() for name in
            ("train/label.bin", "train/numerical.bin", "train/cat_0.bin", "test/cat_0.bin")}


@pytest.mark.parametrize("kind", ["dictionary_parquet", "pandas3_string_parquet", "csv_with_bom",
                                  "csv_mixed_line_ends"])
def test_prepare_clicks_reads_odd_encodings_as_the_plain_file(tmp_path, kind):
    import pandas as pd
    table = click_table()
    plain = tmp_path / "plain.csv"
    table.to_pandas().to_csv(plain, index=False)
    if kind == "dictionary_parquet":
        path = tmp_path / "in.parquet"
        pq.write_table(table.set_column(1, "C1", table.column("C1").dictionary_encode()), path)
    elif kind == "pandas3_string_parquet":
        path = tmp_path / "in.parquet"
        frame = table.to_pandas()
        frame["C1"] = frame["C1"].astype("str")   # pandas 3's default string dtype (large_string in parquet)
        frame.to_parquet(path)
    else:
        text = plain.read_text()
        path = tmp_path / "in.csv"
        if kind == "csv_with_bom":
            path.write_bytes(b"\xef\xbb\xbf" + text.encode())
        else:
            lines = text.splitlines()
            path.write_bytes("".join(l + ("\r\n" if i % 2 else "\n") for i, l in enumerate(lines)).encode())
    flags = ["--label", "click", "--categorical", "C1", "--numerical", "n1", "--split_fractions", "0.8", "0.1", "0.1"]
    for source, out in ((plain, "want"), (path, "got")):
        proc = run_tool(["-m", "recsys_common.prepare_clicks", "--input", str(source), "--output",
                         str(tmp_path / out), *flags])
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert _dataset_files(tmp_path / "got") == _dataset_files(tmp_path / "want")
    assert pd.read_parquet(tmp_path / "got" / "dictionaries" / "0.parquet").equals(
        pd.read_parquet(tmp_path / "want" / "dictionaries" / "0.parquet"))


def test_prepare_clicks_refuses_a_nested_column_naming_file_and_column(tmp_path):
    path = tmp_path / "nested.parquet"
    table = click_table()
    pq.write_table(table.set_column(1, "C1", pa.array([{"a": i} for i in range(ROWS)])), path)
    proc = run_tool(["-m", "recsys_common.prepare_clicks", "--input", str(path), "--output", str(tmp_path / "out"),
                     "--label", "click", "--categorical", "C1", "--numerical", "n1"])
    assert proc.returncode != 0
    assert str(path) in proc.stderr and "C1" in proc.stderr, proc.stderr[-3000:]
    assert not (tmp_path / "out").exists()
