"""The ETL on a 2-worker ``distributed.LocalCluster`` (processes on 127.0.0.1, closed afterwards) writes the same
rows as the single-process run."""
import os

import numpy as np
import pandas as pd
import pytest

from conftest import ETL_OPTIONS
from recsys_common.feature_spec import FeatureSpec
from wide_deep.data.outbrain import features as F


def read_split(directory, mapping):
    spec = FeatureSpec.from_yaml(os.path.join(directory, "feature_spec.yaml"), check_files=True)
    files = spec.source_spec[mapping][0]["files"]
    return pd.concat([pd.read_parquet(spec.resolve_file(f)) for f in files], ignore_index=True), spec


def assert_same_rows(a, b):
    assert list(a.columns) == list(b.columns) and len(a) == len(b)
    for column in a.columns:
        if column in F.MULTIHOT_FEATURES:
            assert [list(v) for v in a[column]] == [list(v) for v in b[column]], column
        elif a[column].dtype.kind == "f":
            np.testing.assert_allclose(a[column], b[column], rtol=1e-6, atol=1e-7, err_msg=column)
        else:
            np.testing.assert_array_equal(a[column], b[column], err_msg=column)
        assert a[column].dtype == b[column].dtype, column


@pytest.mark.slow
def test_two_dask_workers_write_the_single_process_output(raw_outbrain, etl_single, tmp_path):
    import distributed
    from wide_deep.data.outbrain.preproc import run_etl
    lines = []
    out = str(tmp_path / "dask")
    result = run_etl(raw_outbrain, out, cpu=True, use_dask=True, dask_workers=2, out=lines.append, **ETL_OPTIONS)
    for mapping in ("train", "test"):
        dask_rows, dask_spec = read_split(out, mapping)
        single_rows, single_spec = read_split(etl_single, mapping)
        assert_same_rows(dask_rows, single_rows)
        assert dask_spec.to_dict() == single_spec.to_dict()
    # Progress: every step numbered out of the total, with rows/s for the data steps.
    assert "CPU" in lines[0] and "LocalCluster of 2 workers" in lines[0]
    steps = [line for line in lines if line.startswith("[preproc] step ")]
    assert [line.split()[2] for line in steps] == [f"{i}/7" for i in range(1, 8)]
    assert "fit workflow" in steps[3] and "rows/s" in steps[3]
    assert result["rows"]["train"] == dask_spec.metadata["rows"]["train"]
    # The cluster is closed: no client is left behind in this process.
    with pytest.raises(ValueError):
        distributed.get_client()
