"""benchmarks/profile_step.py: op types grouped into the parts of a step, and one real trace of the tiny shape."""
import pytest

import profile_step
from recsys_common.cli import InputError
from recsys_common.tf_profile import group_of


def test_op_types_fall_into_the_parts_of_a_step():
    def part(op_type):
        return group_of(op_type, profile_step.GROUPS)

    assert part("_MklMatMul") == "gemm"
    assert part("_MklBatchMatMulV2") == "gemm"
    assert part("ResourceGather") == "embedding_gather"
    assert part("ResourceScatterAdd") == "embedding_update"
    assert part("ResourceApplyAdam") == "dense_optimizer"
    assert part("StridedSliceGrad") == "slicing_glue"
    assert part("GatherV2") == "interaction_gather"
    assert part("BiasAddGrad") == "bias_relu"
    assert part("Mean") == "other"


def test_a_real_trace_of_the_tiny_shape(tmp_path):
    result = profile_step.main(["--model", "dlrm", "--shape", "tiny", "--warmup_steps", "2", "--steps", "3",
                                "--trace_dir", str(tmp_path / "trace")])
    groups = {g["name"]: g["share"] for g in result["by_group"]}
    assert groups["gemm"] > 0 and groups["embedding_gather"] > 0
    assert sum(groups.values()) == pytest.approx(1.0)
    assert result["embedding_update_xla"] is True and "embedding_update" not in groups  # compiled: not TF's kernels
    assert list((tmp_path / "trace").rglob("*.xplane.pb"))
    with pytest.raises(InputError, match="not empty"):
        profile_step.main(["--shape", "tiny", "--trace_dir", str(tmp_path / "trace")])
