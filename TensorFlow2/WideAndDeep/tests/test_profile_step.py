"""benchmarks/profile_step.py: op types grouped into the parts of the step, and one real trace of a small model."""
import os

import pytest

from conftest import RECIPE_DIR
from recsys_common.cli import InputError
from recsys_common.tf_profile import group_of
from recsys_testing import import_script

# profile_step imports its sibling train_step by name, as when run as python benchmarks/profile_step.py
import_script(os.path.join(RECIPE_DIR, "benchmarks", "train_step.py"), "train_step")
profile_step = import_script(os.path.join(RECIPE_DIR, "benchmarks", "profile_step.py"), "profile_step")


def test_op_types_fall_into_the_parts_of_the_step():
    def part(op_type):
        return group_of(op_type, profile_step.GROUPS)
    assert part("_MklNativeFusedMatMul") == "gemm"
    assert part("_MklMatMul") == "gemm"
    assert part("StatelessRandomUniformFullIntV2") == "dropout_random"
    assert part("SelectV2") == "dropout_apply" and part("GreaterEqual") == "dropout_apply"
    assert part("UnsortedSegmentSum") == "embedding_gradient" and part("Unique") == "embedding_gradient"
    assert part("ResourceGather") == "embedding_gather"
    assert part("ResourceSparseApplyFtrl") == "optimizer"
    assert part("BiasAddGrad") == "bias_relu" and part("ReluGrad") == "bias_relu"
    assert part("Mean") == "other"


def test_a_real_trace_of_a_small_model(tmp_path):
    result = profile_step.main(["--amp", "--global_batch_size", "256", "--deep_hidden_units", "64", "64",
                                "--cardinality_scale", "0.001", "--warmup_steps", "2", "--steps", "2",
                                "--trace_dir", str(tmp_path / "trace")])
    groups = {g["name"]: g["share"] for g in result["by_group"]}
    # The parts this recipe's step is made of are all found: the GEMMs, Dropout16's generator and the gathers.
    assert groups["gemm"] > 0 and groups["dropout_random"] > 0 and groups["embedding_gather"] > 0
    assert sum(groups.values()) == pytest.approx(1.0)
    assert result["precision"] == "mixed_bfloat16" and result["steps"] == 2
    assert list((tmp_path / "trace").rglob("*.xplane.pb"))
    with pytest.raises(InputError, match="not empty"):
        profile_step.main(["--trace_dir", str(tmp_path / "trace")])
