"""recsys_common.tf_profile: op self times summed per step by part, without the profiler's IDLE (the real traces are
tested by both TensorFlow recipes' profile_step tests)."""
import pytest

from recsys_common.tf_profile import group_of, summarize

GROUPS = (("gemm", ("MatMul",)), ("embedding_update", ("Scatter",)))


def test_first_matching_group_else_other():
    assert group_of("_MklNativeFusedMatMul", GROUPS) == "gemm"
    assert group_of("ResourceScatterAdd", GROUPS) == "embedding_update"
    assert group_of("Mean", GROUPS) == "other"
    assert group_of("ScatterMatMul", GROUPS) == "gemm"   # the first group listed wins


def test_summary_is_per_step_without_idle():
    rows = [{"type": "IDLE", "operation": "IDLE", "total_self_time": 9000.0},
            {"type": "_MklMatMul", "operation": "a", "total_self_time": 3000.0},
            {"type": "_MklMatMul", "operation": "b", "total_self_time": 1000.0},
            {"type": "ResourceScatterAdd", "operation": "c", "total_self_time": 2000.0},
            {"type": "Mean", "operation": "d", "total_self_time": 500.0}]
    summary = summarize(rows, steps=2, groups=GROUPS, top=2)
    assert summary["busy_ms_per_step"] == pytest.approx(3.25)
    assert summary["by_group"][0] == {"name": "gemm", "ms_per_step": 2.0, "share": pytest.approx(4 / 6.5)}
    assert [g["name"] for g in summary["by_group"]] == ["gemm", "embedding_update", "other"]
    assert [t["name"] for t in summary["by_op_type"]] == ["_MklMatMul", "ResourceScatterAdd"]
    assert [op["op"] for op in summary["top_ops"]] == ["a", "c"]
