"""The Outbrain ETL's two engines give the same output: ``--engine nvtabular`` (NVTabular 23.8, run by the separate
NVTabular environment's python, ``RECSYS_NVTABULAR_PYTHON``, default ``<repo>/.venv-nvtabular/bin/python``) and the
default engine (pandas/numpy, run here), on the small generated input of the other ETL tests.

Compared: the files of ``train/`` and ``valid/`` (names, ``_file_list.txt``), each file's columns (names, order,
Arrow types), every value, and ``feature_spec.yaml``. Every column is equal bit for bit except the three multi-hot
lists, whose codes are equal up to the order of equally frequent terms: NVTabular orders a vocabulary by count with
numpy's unstable quicksort, whose tie order differs between numpy 1.26 and 2.x (and between CPUs); the default
engine orders ties by term id. So the test checks that one engine's codes map one to one onto the other's and that
each mapped pair of codes stands for terms of the same training count (same vocabulary, cut and list lengths).

3 partitions written as 2 train files (fewer files than partitions) and 4 valid files (more) check NVTabular's
mapping of partitions onto files. The default engine is also run by the NVTabular environment's python (pandas 1.5,
numpy 1.26): the same output, bit for bit, as under pandas 3 / numpy 2. Normalize's sums are held to numpy 1.26's
on arrays large enough (16,000 values) for numpy 2's float32 sum to differ, which the small ETL input is not.

Skips without that python; fails instead under ``RECSYS_REQUIRE_NVTABULAR=1`` (CI builds the environment).
"""
import os
import subprocess

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import RECIPE_DIR, subprocess_env
from wide_deep.data.outbrain import features as F

OPTIONS = {"num_partitions": 3, "num_train_files": 2, "num_valid_files": 4, "seed": 0}
FLAGS = [f for k, v in OPTIONS.items() for f in (f"--{k}", str(v))]


def _nvtabular_python():
    from recsys_testing import nvtabular_python
    return nvtabular_python()


def _run_cli(python, raw_dir, out, engine):
    cmd = [python, "-m", "wide_deep.data.outbrain.preproc", "--engine", engine, "--cpu", "--input_dir", raw_dir,
           "--output_dir", out, *FLAGS]
    proc = subprocess.run(cmd, cwd=RECIPE_DIR, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n" \
                                 f"{proc.stderr[-3000:]}"


@pytest.fixture(scope="module")
def outputs(raw_outbrain, tmp_path_factory):
    python = _nvtabular_python()
    root = tmp_path_factory.mktemp("etl_engines")
    out = {name: str(root / name) for name in ("nvtabular", "default", "default_old_env")}
    _run_cli(python, raw_outbrain, out["nvtabular"], "nvtabular")
    _run_cli(python, raw_outbrain, out["default_old_env"], "default")
    from wide_deep.data.outbrain.preproc import run_etl
    run_etl(raw_outbrain, out["default"], out=lambda line: None, **OPTIONS)
    return out


def _parquet_names(directory):
    return sorted(n for n in os.listdir(directory) if n.endswith(".parquet"))


def _count_of_code(out_dir):
    """Per list feature: code -> the training count of its term (codes 0-2, pad/null/OOV: minus the code)."""
    with np.load(os.path.join(out_dir, "workflow", "lists.npz"), allow_pickle=False) as z:
        return {name: np.concatenate([[0, -1, -2], z[f"{name}.vocabulary_count"]]) for name in F.MULTIHOT_FEATURES}


def _assert_lists_equal_up_to_ties(name, want, got, count_of_code, mapping):
    """``want``/``got``: list columns (pyarrow). Same lengths; codes map one to one (``mapping`` accumulates over
    all files), and mapped codes stand for terms of equal training count."""
    assert want.type == got.type, name
    np.testing.assert_array_equal(want.offsets.to_numpy(), got.offsets.to_numpy(), err_msg=f"{name}: list lengths")
    a, b = want.values.to_numpy(), got.values.to_numpy()
    counts = count_of_code[name]
    assert b.max(initial=0) < len(counts) and a.max(initial=0) < len(counts), name
    np.testing.assert_array_equal(counts[a], counts[b], err_msg=f"{name}: codes of terms of different counts")
    for x, y in set(zip(a.tolist(), b.tolist())):
        assert mapping.setdefault(x, y) == y, f"{name}: code {x} maps to {mapping[x]} and {y}"


def test_default_engine_equals_nvtabular(outputs):
    nvt_dir, ours_dir = outputs["nvtabular"], outputs["default"]
    count_of_code = _count_of_code(ours_dir)
    mappings = {name: {} for name in F.MULTIHOT_FEATURES}
    checked = 0
    for subdir, files in (("train", OPTIONS["num_train_files"]), ("valid", OPTIONS["num_valid_files"])):
        names = _parquet_names(os.path.join(nvt_dir, subdir))
        assert names == _parquet_names(os.path.join(ours_dir, subdir)) == [f"part_{i}.parquet" for i in range(files)]
        for directory in (nvt_dir, ours_dir):
            with open(os.path.join(directory, subdir, "_file_list.txt")) as f:
                listed = f.read().split()
            assert listed == [str(files)] + [os.path.join(directory, subdir, n) for n in names]
        for name in names:
            want = pq.read_table(os.path.join(nvt_dir, subdir, name))
            got = pq.read_table(os.path.join(ours_dir, subdir, name))
            assert want.schema.remove_metadata().equals(got.schema.remove_metadata()), (subdir, name)
            assert want.num_rows == got.num_rows > 0, (subdir, name)
            for column in want.column_names:
                a, b = want.column(column).combine_chunks(), got.column(column).combine_chunks()
                if column in F.MULTIHOT_FEATURES:
                    _assert_lists_equal_up_to_ties(column, a, b, count_of_code, mappings[column])
                else:   # bit for bit (floats compared as their bytes' integers)
                    x, y = a.to_numpy(zero_copy_only=False), b.to_numpy(zero_copy_only=False)
                    if x.dtype.kind == "f":
                        x, y = x.view(f"i{x.itemsize}"), y.view(f"i{y.itemsize}")
                    np.testing.assert_array_equal(x, y, err_msg=f"{subdir}/{name}: {column}")
                checked += 1
    assert checked == (OPTIONS["num_train_files"] + OPTIONS["num_valid_files"]) * len(F.OUTPUT_COLUMNS)
    for name, mapping in mappings.items():   # one to one over all files
        assert len(set(mapping.values())) == len(mapping), name
    with open(os.path.join(nvt_dir, "feature_spec.yaml")) as f, \
            open(os.path.join(ours_dir, "feature_spec.yaml")) as g:
        assert f.read() == g.read()


def test_default_engine_same_under_pandas_1_5_and_3(outputs):
    """The default engine run by the NVTabular environment (pandas 1.5.3, numpy 1.26, pyarrow 12) writes what it
    writes under pandas 3 / numpy 2, bit for bit, lists included."""
    old, new = outputs["default_old_env"], outputs["default"]
    for subdir in ("train", "valid"):
        names = _parquet_names(os.path.join(new, subdir))
        assert names == _parquet_names(os.path.join(old, subdir))
        for name in names:
            a = pq.read_table(os.path.join(old, subdir, name))
            b = pq.read_table(os.path.join(new, subdir, name))
            assert a.schema.remove_metadata().equals(b.schema.remove_metadata()), (subdir, name)
            assert a.equals(b), (subdir, name)
    with open(os.path.join(old, "feature_spec.yaml")) as f, open(os.path.join(new, "feature_spec.yaml")) as g:
        assert f.read() == g.read()


SUMS_PROGRAM = """
import json, sys
import numpy as np
rng = np.random.default_rng(1)
out = []
for dtype in (np.float32, np.float64):
    for n in (7, 9, 128, 1000, 8191, 8193, 16000, 16385, 100003):
        v = (rng.integers(1, 300, n).astype(dtype) / dtype(7)) * dtype(rng.random())
        out.append(float(np.sum(v)))
print(json.dumps(out))
"""


def test_numpy1_sum_is_numpy_1_26s_sum():
    """Normalize's moments are float32 and float64 sums that numpy 2 rounds otherwise than numpy 1.26 (its float32
    reduction): ``engine.numpy1_sum`` gives numpy 1.26's, checked against the NVTabular environment's numpy on the
    same arrays (sizes around the pairwise block of 128 and the reduction runs of 8192)."""
    import json
    from wide_deep.data.outbrain.engine import numpy1_sum
    proc = subprocess.run([_nvtabular_python(), "-c", SUMS_PROGRAM], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = json.loads(proc.stdout)
    rng = np.random.default_rng(1)
    got = []
    for dtype in (np.float32, np.float64):
        for n in (7, 9, 128, 1000, 8191, 8193, 16000, 16385, 100003):
            v = (rng.integers(1, 300, n).astype(dtype) / dtype(7)) * dtype(rng.random())
            got.append(float(numpy1_sum(v)))
    assert got == want
