"""recsys_common.checkpoints: the catalogue both DLRM recipes (and NCF, Wide & Deep) read their step_<N> dirs with."""
import json
import os
import time

import pytest

from recsys_common import checkpoints
from recsys_common.checkpoints import CheckpointError, SavePolicy


def make(root, step, marker="state.json", version=1, **fields):
    path = os.path.join(root, checkpoints.checkpoint_name(step))
    os.makedirs(path, exist_ok=True)
    checkpoints.write_marker(path, marker, {"format_version": version, **fields})
    return path


def test_newest_complete_checkpoint_wins_and_incomplete_ones_are_ignored(tmp_path):
    root = str(tmp_path)
    make(root, 4)
    newest = make(root, 12)
    os.makedirs(os.path.join(root, "step_000000020"))            # no marker: a save a crash interrupted
    os.makedirs(os.path.join(root, ".step_000000024.tmp-abc"))   # a staging directory
    assert [s for s, _ in checkpoints.list_checkpoints(root, "state.json")] == [4, 12]
    assert checkpoints.resolve_checkpoint(root, "state.json") == newest
    assert checkpoints.resolve_checkpoint(newest, "state.json") == newest
    assert checkpoints.list_checkpoints(root, "meta.json") == []  # another recipe's marker: not ours
    assert checkpoints.remove_stale_temporaries(root) == [".step_000000024.tmp-abc"]
    with pytest.raises(CheckpointError, match=r"no complete checkpoint in it \(neither meta.json"):
        checkpoints.resolve_checkpoint(root, "meta.json")
    with pytest.raises(CheckpointError, match=r"nowhere: checkpoint not found \(--load\)"):
        checkpoints.resolve_checkpoint(str(tmp_path / "nowhere"), "meta.json", "--load")


def test_marker_is_checked(tmp_path):
    path = make(str(tmp_path), 1, version=1)
    assert checkpoints.read_marker(path, "state.json", 1)["format_version"] == 1
    with pytest.raises(CheckpointError, match=r"format 1 \(too old\); this code reads format 2"):
        checkpoints.read_marker(path, "state.json", 2, version_hints={1: "too old"})
    with pytest.raises(CheckpointError, match=r"no 'global_step' field"):
        checkpoints.read_marker(path, "state.json", 1, required=("global_step",))
    old = os.path.join(str(tmp_path), "wide_deep_checkpoint")  # Wide & Deep's marker before format_version
    os.makedirs(old)
    with open(os.path.join(old, "meta.json"), "w") as f:
        json.dump({"step": 30}, f)
    assert checkpoints.read_marker(old, "meta.json", 1, required=("step",), unversioned=1)["step"] == 30
    with pytest.raises(CheckpointError, match="checkpoint format None; this code reads format 1"):
        checkpoints.read_marker(old, "meta.json", 1)
    with open(os.path.join(path, "state.json"), "w") as f:
        f.write("[1, 2]")
    with pytest.raises(CheckpointError, match="expected a JSON object, found list"):
        checkpoints.read_marker(path, "state.json", 1)


def test_config_check_names_every_differing_field_and_its_flag():
    saved = {"dim": 8, "mlp": (16, 4), "model": "dlrm", "same": [1]}
    given = {"dim": 16, "mlp": [32, 4], "model": "dlrm", "same": (1,)}  # a tuple equals the list JSON gives back
    with pytest.raises(CheckpointError) as e:
        checkpoints.check_config(saved, given, "ck/state.json", {"dim": "--embedding_dim"})
    message = str(e.value)
    assert message.startswith("ck/state.json: the checkpoint's model differs")
    assert "dim: checkpoint 8, flags 16 (set by --embedding_dim)" in message
    assert "mlp: checkpoint (16, 4), flags [32, 4] (set by --mlp)" in message
    assert message.split("Differing: ")[1].count(": checkpoint ") == 2  # not model, not same
    checkpoints.check_config(saved, given, "ck", fields=["model", "same"])  # only these compared: no error


def test_training_changes_warn():
    with pytest.warns(UserWarning, match=r"ck: resuming with batch_size 64 -> 128; .* \(why\)"):
        assert checkpoints.warn_training_changes({"batch_size": 64, "lr": 1}, {"batch_size": 128, "lr": 1},
                                                 ["batch_size", "lr"], "ck", " (why)") == ["batch_size 64 -> 128"]


def test_prune_keeps_the_newest_and_uses_the_recipes_remover(tmp_path):
    root = str(tmp_path)
    for step in (1, 2, 3):
        make(root, step)
    removed = []
    assert [s for s, _ in checkpoints.prune_checkpoints(root, 2, "state.json", removed.append)] == [1]
    assert removed == [os.path.join(root, "step_000000001")]
    assert checkpoints.prune_checkpoints(root, 0, "state.json") == []
    checkpoints.prune_checkpoints(root, 1, "state.json")
    assert [s for s, _ in checkpoints.list_checkpoints(root, "state.json")] == [3]


def test_other_runs(tmp_path):
    root = str(tmp_path)
    assert checkpoints.other_runs(root, "state.json", None) == ([], False)
    make(root, 1)
    newest = make(root, 2)
    assert checkpoints.other_runs(root, "state.json", None)[1] is False
    assert checkpoints.other_runs(root, "state.json", root)[1] is True       # resumed from the directory: its newest
    assert checkpoints.other_runs(root, "state.json", newest)[1] is True
    assert checkpoints.other_runs(root, "state.json", os.path.join(root, "step_000000001"))[1] is False


def test_save_policy(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    policy = SavePolicy(every_minutes=0.5)
    assert not policy.due(1)
    clock[0] += 31
    assert policy.due(2)
    policy.saved()
    assert not policy.due(3)
    asked = []
    several = SavePolicy(every_minutes=0.5, world_size=2, agree=lambda late: asked.append(late) or True,
                         check_every=4)
    assert [several.due(s) for s in (1, 2, 3, 4)] == [False, False, False, True]  # the collective: every 4th step
    assert asked == [False]
    for bad, match in (({"every_steps": 0}, "at least 1"), ({"every_minutes": float("nan")}, "positive"),
                       ({"keep": -1}, "keep all"), ({"every_minutes": 1, "world_size": 2}, "agree")):
        with pytest.raises(ValueError, match=match):
            SavePolicy(**bad)
