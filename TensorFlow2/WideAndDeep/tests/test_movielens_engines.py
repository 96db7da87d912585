"""The MovieLens ETL's own workflow (``wide_deep.movielens.workflow``): NVTabular 23.8 Categorify's encoding on a
table small enough to check by hand, and the whole output equal to ``--engine nvtabular``'s (run in the separate
NVTabular environment, ``recsys_testing.nvtabular_python``) value for value, except the order of equally
frequent values in a vocabulary, which NVTabular leaves to numpy's unstable quicksort."""
import json
import os
import subprocess

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from conftest import REPO_ROOT, RECIPE_DIR

CATEGORICAL = ("userId", "movieId", "genres")


def _tiny_workflow():
    from wide_deep.movielens.workflow import MovieLensWorkflow, movies_table
    movies = movies_table([30, 10, 20], [["Drama"], ["Comedy", "Drama"], ["Action", "Comedy", "Drama"]])
    train = pd.DataFrame({"userId": [7, 5, 7, 9, 5, 9, 4], "movieId": [10, 20, 10, 30, 30, 10, 20],
                          "rating": [5, 3, 4, 1, 4, 2, 5]})
    wf = MovieLensWorkflow(movies)
    wf.fit([train.iloc[:3], train.iloc[3:]])   # two parts: counts add up across parts
    return wf


def test_vocabulary_order_and_reserved_indices():
    wf = _tiny_workflow()
    voc = {c: wf.vocabularies[c].to_pydict() for c in CATEGORICAL}
    # by decreasing count, equally frequent values in increasing order; counts from train only
    assert voc["userId"] == {"userId": [5, 7, 9, 4], "userId_size": [2, 2, 2, 1]}
    assert voc["movieId"] == {"movieId": [10, 20, 30], "movieId_size": [3, 2, 2]}
    # list column: every genre of every rating counted (Drama 7, Comedy 5, Action 2)
    assert voc["genres"] == {"genres": ["Drama", "Comedy", "Action"], "genres_size": [7, 5, 2]}
    assert wf.cardinalities() == {"userId": 7, "movieId": 6, "genres": 6}   # vocabulary + pad, null, OOV
    new = pd.DataFrame({"userId": [4, 8, 5], "movieId": [20, 10, 99], "rating": [3.5, 3.0, 4.0]})
    out = wf.transform_table(new)
    assert out.column_names == ["userId", "movieId", "genres", "rating"]
    assert [str(t) for t in out.schema.types] == ["int64", "int64", "list<item: int64>", "int8"]
    assert out.column("userId").to_pylist() == [6, 2, 3]          # 8 unseen: OOV index 2; 5 first: index 3
    assert out.column("movieId").to_pylist() == [4, 3, 2]         # 99: not in train (nor in the movies) -> 2
    assert out.column("genres").to_pylist() == [[5, 4, 3], [4, 3], None]   # movie 99 has no genres: null list
    assert out.column("rating").to_pylist() == [1, 0, 1]          # rating > 3: 3.5 positive, 3 not


def test_null_values_encode_to_one_and_are_not_counted():
    import pyarrow as pa
    from wide_deep.movielens.workflow import MovieLensWorkflow, movies_table
    wf = MovieLensWorkflow(movies_table([1], [["Drama"]]))
    part = pa.table({"userId": pa.array([3, None, 3], pa.int64()), "movieId": pa.array([1, 1, 1], pa.int64()),
                     "rating": pa.array([5, 5, 1], pa.int64())})
    wf.fit([part])
    assert wf.vocabularies["userId"].to_pydict() == {"userId": [3], "userId_size": [2]}
    assert wf.transform_table(part).column("userId").to_pylist() == [3, 1, 3]


def test_saved_workflow_is_json_and_parquet_and_loads(tmp_path):
    from wide_deep.movielens.workflow import WorkflowFormatError, load_workflow
    wf = _tiny_workflow()
    wf.save(str(tmp_path / "workflow"))
    assert sorted(os.listdir(tmp_path / "workflow")) == ["movies.parquet", "vocab.genres.parquet",
                                                         "vocab.movieId.parquet", "vocab.userId.parquet",
                                                         "workflow.json"]
    with open(tmp_path / "workflow" / "workflow.json") as f:
        assert json.load(f)["cardinalities"] == wf.cardinalities()
    again = load_workflow(str(tmp_path / "workflow"))
    new = pd.DataFrame({"userId": [4, 8], "movieId": [20, 30], "rating": [5, 1]})
    assert again.transform_table(new).equals(wf.transform_table(new))
    with pytest.raises(WorkflowFormatError, match="workflow.json"):
        load_workflow(str(tmp_path))


def _relabelling(ours_dir, nvt_dir, column):
    """NVTabular's index -> ours; asserts both vocabularies hold the same values with the same count at every
    index (so the two orders differ only among equally frequent values)."""
    a = pq.read_table(os.path.join(ours_dir, "workflow", f"vocab.{column}.parquet"))
    b = pq.read_table(os.path.join(nvt_dir, "workflow", f"vocab.{column}.parquet"))
    np.testing.assert_array_equal(a.column(1).to_numpy(), b.column(1).to_numpy())
    ours = {v: i for i, v in enumerate(a.column(0).to_pylist())}
    theirs = b.column(0).to_pylist()
    assert sorted(ours) == sorted(theirs)
    mapping = np.arange(len(theirs) + 3)
    mapping[3:] = [ours[v] + 3 for v in theirs]
    # NVTabular's own vocabulary files (its categories/) say the same as the ones it saved in our format
    nvt = pq.read_table(os.path.join(nvt_dir, "workflow", "categories", f"unique.{column}.parquet"))
    assert nvt.column(column).to_pylist() == theirs
    return mapping


def test_etl_equals_the_nvtabular_engine(tmp_path):
    """Three parts of generated ml-25m-layout ratings through both engines: the same feature_spec.yaml
    (cardinalities as get_embedding_sizes gives them), files, schemas, row order, labels and genre lists, and the
    same encoded ids up to the order of equally frequent values."""
    from recsys_testing import nvtabular_python
    from wide_deep.movielens.etl import SplitDraw, read_movielens, run_etl
    from wide_deep.movielens.generate import generate
    from wide_deep.movielens.workflow import load_workflow
    python = nvtabular_python()
    src = str(tmp_path / "ml-25m")
    generate(src, rows=6000, movies=300, seed=1, out=lambda s: None)
    ours, nvt = str(tmp_path / "ours"), str(tmp_path / "nvt")
    run_etl(src, ours, seed=0, part_rows=2000, out=lambda s: None)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([RECIPE_DIR, os.path.join(REPO_ROOT, "common")]))
    proc = subprocess.run([python, "-m", "wide_deep.movielens.etl", "--input_dir", src, "--output_dir", nvt,
                           "--seed", "0", "--part_rows", "2000", "--engine", "nvtabular"], cwd=RECIPE_DIR, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(os.path.join(ours, "feature_spec.yaml")) as a, open(os.path.join(nvt, "feature_spec.yaml")) as b:
        assert yaml.safe_load(a) == yaml.safe_load(b)
    mapping = {c: _relabelling(ours, nvt, c) for c in CATEGORICAL}
    for sub in ("train", "valid"):
        names = sorted(n for n in os.listdir(os.path.join(nvt, sub)) if n.endswith(".parquet"))
        assert names == [f"part_{i}.parquet" for i in range(3)]
        assert sorted(n for n in os.listdir(os.path.join(ours, sub)) if n.endswith(".parquet")) == names
        for aux in ("_file_list.txt", "_metadata.json"):
            with open(os.path.join(ours, sub, aux)) as a, open(os.path.join(nvt, sub, aux)) as b:
                assert a.read().replace(ours, "OUT") == b.read().replace(nvt, "OUT")
        for name in names:
            a, b = pq.read_table(os.path.join(ours, sub, name)), pq.read_table(os.path.join(nvt, sub, name))
            assert a.schema.remove_metadata() == b.schema.remove_metadata()
            assert a.num_rows == b.num_rows > 0
            for c in ("userId", "movieId"):
                np.testing.assert_array_equal(a.column(c).to_numpy(), mapping[c][b.column(c).to_numpy()])
            ga, gb = a.column("genres").combine_chunks(), b.column("genres").combine_chunks()
            np.testing.assert_array_equal(ga.offsets.to_numpy(), gb.offsets.to_numpy())
            np.testing.assert_array_equal(ga.flatten().to_numpy(), mapping["genres"][gb.flatten().to_numpy()])
            assert a.column("rating").equals(b.column("rating"))
    # the nvtabular engine's workflow/ loads with our loader too and encodes the raw ratings as its own output
    ratings, _ = read_movielens(src)
    is_valid = SplitDraw(0.2, 0)(len(ratings))
    first_train = ratings.iloc[:2000][~is_valid[:2000]].reset_index(drop=True)
    again = load_workflow(os.path.join(nvt, "workflow")).transform_table(first_train)
    assert again.equals(pq.read_table(os.path.join(nvt, "train", "part_0.parquet")).replace_schema_metadata(None))
