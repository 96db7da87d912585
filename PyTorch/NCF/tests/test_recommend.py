"""recommend.py: top-K unseen items per user from a checkpoint, checked against a brute-force ranking; bad input."""
import csv
import json
import os

import numpy as np
import pytest
import torch

from neumf import checkpointing as ncf_checkpointing
from neumf import recommend
from conftest import make_tiny_dataset, train_tiny_neumf
from neumf.data import load_dataset
from recsys_common.cli import run_main


def cli(argv):
    """``python recommend.py ARGV``: exits (SystemExit), 2 with one error line for bad input."""
    run_main(recommend.main, argv, prog="recommend.py", input_errors=recommend.INPUT_ERRORS)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny dataset and a 4-epoch NeuMF checkpoint (HR@10 0.46) (ncf.py's format) trained on it."""
    root = tmp_path_factory.mktemp("recommend")
    data, checkpoint = train_tiny_neumf(str(root))
    return {"data": data, "checkpoint": checkpoint, "root": root}


def brute_force(checkpoint, data_dir, user, k):
    """Score every item one pair at a time; drop training items; sort by (-probability, item)."""
    model, _ = recommend.load_model(checkpoint)
    data = load_dataset(data_dir)
    seen = set(data.train_items[data.train_users == user].tolist())
    with torch.no_grad():
        probs = torch.sigmoid(model(torch.full((data.num_items,), user), torch.arange(data.num_items))).numpy()
    candidates = [i for i in range(data.num_items) if i not in seen]
    ranked = sorted(candidates, key=lambda i: (-probs[i], i))[:k]
    return ranked, [float(probs[i]) for i in ranked], seen


def test_recommend_matches_brute_force_and_excludes_seen_items(trained, tmp_path):
    out = tmp_path / "rec.csv"
    users = [0, 7, 199]
    recommend.main(["--load_checkpoint_path", trained["checkpoint"], "--data", trained["data"], "--users",
                    *map(str, users), "-k", "10", "--output", str(out), "--max_rows", "500"])
    with open(out) as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 30
    for user in users:
        mine = [r for r in rows if int(r["user"]) == user]
        assert [int(r["rank"]) for r in mine] == list(range(1, 11))
        expected_items, expected_probs, seen = brute_force(trained["checkpoint"], trained["data"], user, 10)
        assert seen  # the user has training items, so exclusion is exercised
        assert [int(r["item"]) for r in mine] == expected_items
        assert not seen & {int(r["item"]) for r in mine}
        np.testing.assert_allclose([float(r["probability"]) for r in mine], expected_probs, rtol=1e-6, atol=1e-7)


def test_seen_items_change_the_answer(trained):
    """Without exclusion a seen item would be recommended: the model ranks training positives high."""
    model, config = recommend.load_model(trained["checkpoint"])
    data = load_dataset(trained["data"])
    empty = np.zeros(config["num_users"] + 1, dtype=np.int64)
    unfiltered = recommend.recommend(model, [0], data.num_items, empty, np.zeros(0, dtype=np.int64), 10)[0][1]
    seen = set(data.train_items[data.train_users == 0].tolist())
    assert seen & set(unfiltered)


def test_json_output_users_file_and_overwrite(trained, tmp_path):
    users_file = tmp_path / "users.csv"
    users_file.write_text("user,comment\n3,a\n\n5,b\n")
    out = tmp_path / "rec.json"
    args = ["--load_checkpoint_path", trained["checkpoint"], "--data", trained["data"], "--users_file",
            str(users_file), "-k", "4", "--output", str(out)]
    recommend.main(args)
    doc = json.loads(out.read_text())
    assert [r["user"] for r in doc["recommendations"]] == [3, 5]
    assert doc["topk"] == 4 and all(len(r["items"]) == 4 for r in doc["recommendations"])
    assert doc["recommendations"][0]["items"] == brute_force(trained["checkpoint"], trained["data"], 3, 4)[0]
    before = out.read_text()
    with pytest.raises(SystemExit) as err:
        cli(args)
    assert err.value.code == 2 and out.read_text() == before
    recommend.main(args + ["--overwrite", "-k", "2"])
    assert len(json.loads(out.read_text())["recommendations"][0]["items"]) == 2


@pytest.mark.parametrize("extra, message", [
    (["--users", "0", "200"], "unknown user id(s) [200]"),
    (["--users", "-1"], "unknown user id(s) [-1]"),
    (["--users", "0", "-f", "16"], "-f/--factors 16 given, the checkpoint was trained with -f/--factors 8"),
    (["--users", "0", "--layers", "32", "16"], "--layers 32 16 given, the checkpoint was trained with --layers 16 8"),
])
def test_bad_requests_are_clear_errors(trained, tmp_path, capsys, extra, message):
    out = tmp_path / "rec.csv"
    with pytest.raises(SystemExit) as err:
        cli(["--load_checkpoint_path", trained["checkpoint"], "--data", trained["data"], "--output",
                        str(out), *extra])
    assert err.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists() and os.listdir(tmp_path) == []


def test_bad_users_file_names_the_line(trained, tmp_path, capsys):
    users_file = tmp_path / "users.txt"
    users_file.write_text("1\n2\nabc\n")
    with pytest.raises(SystemExit):
        cli(["--load_checkpoint_path", trained["checkpoint"], "--data", trained["data"], "--users_file",
                        str(users_file), "--output", str(tmp_path / "r.csv")])
    assert f"{users_file}: line 3: user id 'abc' is not an integer" in capsys.readouterr().err


def test_bare_state_dict_with_wrong_layers_lists_the_shapes(trained, tmp_path, capsys):
    bare = tmp_path / "bare.pth"
    torch.save(torch.load(trained["checkpoint"], weights_only=True)["model"], bare)
    model, config = recommend.load_model(str(bare), factors=8, layers=[16, 8], dropout=0.5)
    data = load_dataset(trained["data"])
    assert (config["num_users"], config["num_items"]) == (data.num_users, data.num_items)  # from the shapes
    with pytest.raises(ncf_checkpointing.CheckpointError, match=r"mlp\.mlp\.0\.weight: shape \[8, 16\] in the checkpoint, "
                                                  r"\[16, 32\] for this configuration"):
        recommend.load_model(str(bare), factors=8, layers=[32, 16], dropout=0.5)


def test_other_dataset_is_refused(trained, tmp_path, capsys):
    other = make_tiny_dataset(str(tmp_path), users=150, items=300, mean_per_user=25)
    with pytest.raises(SystemExit):
        cli(["--load_checkpoint_path", trained["checkpoint"], "--data", other, "--users", "0",
                        "--output", str(tmp_path / "r.csv")])
    assert "not its dataset" in capsys.readouterr().err
