"""NVTabular's CPU workflow in the separate NVTabular environment (.venv-nvtabular): Categorify, FillMissing,
Normalize fit, transform, save and load with its 2023 pins. Run by ci/tests/test_stack.py with that environment's
python: ``python nvt_workflow_check.py OUT_DIR``; exits 0 and prints ``ok`` when every check holds."""
import sys
import warnings
from pathlib import Path

import numpy as np
import pyarrow_hotfix  # noqa: F401  (pyarrow 12: CVE-2023-47248; this environment reads only files it wrote)

warnings.filterwarnings("ignore", message=r".*dtype mappings did not load successfully")
warnings.filterwarnings("ignore", message=r".*NVTabular Dataset (in|to) CPU mode")


def main(tmp_path: Path) -> None:
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq
    import nvtabular as nvt
    from nvtabular import ops

    cats = ["b", "a", "b", None, "c", "b", "a", "b"]
    nums = [1.0, np.nan, 3.0, 4.0, np.nan, 6.0, 7.0, 8.0]
    pq.write_table(pa.table({"cat": cats, "num": nums, "label": [0, 1, 0, 1, 1, 0, 1, 0]}), tmp_path / "in.parquet")
    dataset = nvt.Dataset(str(tmp_path / "in.parquet"), engine="parquet", cpu=True)
    workflow = nvt.Workflow((["cat"] >> ops.Categorify(out_path=str(tmp_path / "categories")))
                            + (["num"] >> ops.FillMissing(fill_val=0.0) >> ops.Normalize())
                            + ["label"])
    workflow.fit(dataset)
    workflow.transform(dataset).to_parquet(str(tmp_path / "out"), out_files_per_proc=1)
    workflow.save(str(tmp_path / "workflow"))

    out = pd.concat(pd.read_parquet(p) for p in sorted((tmp_path / "out").glob("*.parquet")))
    assert len(out) == len(cats)
    # Categorify: one integer code per distinct value, the same value always gets the same code,
    # and the most frequent category ("b", 4 times) the smallest code among the real values.
    codes = dict(zip(cats, out["cat"].tolist()))
    assert len({codes["a"], codes["b"], codes["c"], codes[None]}) == 4
    assert [c for v, c in zip(cats, out["cat"]) if v == "b"] == [codes["b"]] * 4
    assert codes["b"] < codes["a"] < codes["c"]
    # FillMissing then Normalize: (filled - mean) / std of the filled column.
    filled = np.nan_to_num(np.array(nums), nan=0.0)
    got = out["num"].to_numpy()
    assert not np.isnan(got).any()
    assert abs(got.mean()) < 1e-6
    expected = [(filled - filled.mean()) / filled.std(ddof=d) for d in (0, 1)]
    assert any(np.allclose(got, e, atol=1e-5) for e in expected), (got, expected)

    reloaded = nvt.Workflow.load(str(tmp_path / "workflow"))
    again = reloaded.transform(nvt.Dataset(str(tmp_path / "in.parquet"), engine="parquet", cpu=True)).to_ddf().compute()
    np.testing.assert_array_equal(again["cat"].to_numpy(), out["cat"].to_numpy())


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    print("ok")
