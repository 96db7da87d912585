"""scripts.profile_step: op types grouped into the parts of a step, and one real trace of the tiny shape."""
import pytest

from dlrm_dcnv2.scripts import profile_step
from recsys_common.cli import InputError


def test_op_types_fall_into_the_parts_of_a_step():
    assert profile_step.group_of("_MklMatMul") == "gemm"
    assert profile_step.group_of("_MklBatchMatMulV2") == "gemm"
    assert profile_step.group_of("ResourceGather") == "embedding_gather"
    assert profile_step.group_of("ResourceScatterAdd") == "embedding_update"
    assert profile_step.group_of("ResourceApplyAdam") == "dense_optimizer"
    assert profile_step.group_of("StridedSliceGrad") == "slicing_glue"
    assert profile_step.group_of("GatherV2") == "interaction_gather"
    assert profile_step.group_of("BiasAddGrad") == "bias_relu"
    assert profile_step.group_of("Mean") == "other"


def test_summary_is_per_step_without_idle():
    rows = [{"type": "IDLE", "operation": "IDLE", "total_self_time": 9000.0},
            {"type": "_MklMatMul", "operation": "a", "total_self_time": 3000.0},
            {"type": "_MklMatMul", "operation": "b", "total_self_time": 1000.0},
            {"type": "ResourceScatterAdd", "operation": "c", "total_self_time": 2000.0}]
    summary = profile_step.summarize(rows, steps=2, top=2)
    assert summary["busy_ms_per_step"] == pytest.approx(3.0)
    assert summary["by_group"][0] == {"name": "gemm", "ms_per_step": 2.0, "share": pytest.approx(2 / 3)}
    assert summary["by_group"][1]["name"] == "embedding_update"
    assert [op["op"] for op in summary["top_ops"]] == ["a", "c"]


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
