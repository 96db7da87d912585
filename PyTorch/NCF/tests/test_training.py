"""ncf.main end to end on tiny generated data: learning, checkpoints, exact resume, AMP, bad checkpoints."""
import math
import os
import re
import time

import pytest
import torch

from neumf import checkpointing as ncf_checkpointing, cli as ncf_cli, train as ncf_train
from conftest import NCF_DIR
from neumf.data import load_dataset
from recsys_common.logger import read_log

SMALL = ["-b", "512", "-l", "0.01", "-b1", "0.9", "-b2", "0.999", "-f", "8", "--layers", "16", "8",
         "--valid_batch_size", "5000", "--seed", "3"]


def run(tiny_data, tmp_path, *extra, log="log.json"):
    return ncf_train.main(["--data", tiny_data, *SMALL, "--log_path", str(tmp_path / log), *extra])


@pytest.mark.parametrize("model, min_hr", [("neumf", 0.65), ("gmf", 0.5), ("mlp", 0.28)])
def test_models_learn_the_hidden_taste(tiny_data, tmp_path, model, min_hr):
    summary = run(tiny_data, tmp_path, "-e", "4", "--model", model, "--dropout", "0")
    # 100 random negatives: a random ranking scores HR@10 ~ 0.10, popularity 0.238 on this data;
    # measured after 4 epochs: NeuMF 0.734, GMF 0.606, MLP 0.334
    assert summary["best_hr@10"] > min_hr, summary
    assert 0 < summary["best_ndcg@10"] < summary["best_hr@10"]


def test_log_has_the_dllogger_records(tiny_data, tmp_path):
    started = time.perf_counter()
    summary = run(tiny_data, tmp_path, "-e", "2", "-n", "1", "--select_on", "test")  # NVIDIA's rows and records
    wall = time.perf_counter() - started
    records = read_log(str(tmp_path / "log.json"))
    steps = [r["step"] for r in records]
    assert steps[0] == "PARAMETER" and steps[1:3] == [[0], [1]] and steps[-1] == []
    data = load_dataset(tiny_data)
    train_rows = len(data.train_users) * 2  # each positive and its one negative (-n 1)
    eval_rows = len(data.test_items)        # 101 candidates per user
    epochs = [records[1]["data"], records[2]["data"]]
    for epoch in epochs:
        # throughputs are the rows of the epoch over the logged times of its phases
        assert epoch["train_throughput"] * epoch["train_epoch_time"] == pytest.approx(train_rows, rel=1e-9)
        assert epoch["eval_throughput"] * epoch["validation_epoch_time"] == pytest.approx(eval_rows, rel=1e-9)
        assert epoch["epoch_time"] == pytest.approx(epoch["train_epoch_time"] + epoch["validation_epoch_time"])
        assert 0 < epoch["ndcg@10"] < epoch["hr@10"]
    assert sum(e["epoch_time"] for e in epochs) <= wall  # measured inside the run, not invented
    # learning, not noise: a random ranking scores HR@10 ~ 0.10, popularity 0.238 on this data, and a constant guess
    # has the loss ln 2 (measured: HR@10 0.208 / 0.398, loss 0.668 / 0.608 after epochs 0 / 1)
    assert epochs[1]["hr@10"] > 0.3 and epochs[1]["loss"] < epochs[0]["loss"] < math.log(2)
    assert summary["best_hr@10"] == max(e["hr@10"] for e in epochs)
    assert {"best_hr@10", "best_epoch", "time_to_target"} <= set(records[-1]["data"])


def test_threshold_stops_early_and_records_time_to_target(tiny_data, tmp_path):
    summary = run(tiny_data, tmp_path, "-e", "10", "-t", "0.2")
    # reached after epoch 0: the time to target is that epoch's training + evaluation time (not the wall clock)
    assert summary["last"]["epoch"] == 0 and summary["last"]["hr@10"] >= 0.2
    assert summary["time_to_target"] == pytest.approx(summary["last"]["epoch_time"])


def test_best_checkpoint_and_test_mode(tiny_data, tmp_path):
    ckpt = tmp_path / "ckpt"
    summary = run(tiny_data, tmp_path, "-e", "2", "-n", "1", "-b", "2048", "--checkpoint_dir", str(ckpt))
    assert sorted(os.listdir(ckpt)) == ["last.pth", "model.pth"]  # no temporary files left behind
    state = torch.load(ckpt / "model.pth", weights_only=True)
    assert state["epoch"] == summary["best_epoch"] and "optimizer" in state
    tested = run(tiny_data, tmp_path, "--mode", "test", "--load_checkpoint_path", str(ckpt / "model.pth"),
                 log="test.json")
    assert tested["hr@10"] == pytest.approx(summary["best_hr@10"], abs=1e-12)
    # NVIDIA's behaviour: --mode test without a path evaluates --checkpoint_dir/model.pth
    from_dir = run(tiny_data, tmp_path, "--mode", "test", "--checkpoint_dir", str(ckpt), log="dir.json")
    assert from_dir["hr@10"] == tested["hr@10"]
    with pytest.raises(ncf_train.INPUT_ERRORS):
        run(tiny_data, tmp_path, "--mode", "test", log="none.json")  # nothing to evaluate: an error, not a random model
    # NVIDIA's layout: a bare state_dict loads too
    torch.save(state["model"], tmp_path / "bare.pth")
    bare = run(tiny_data, tmp_path, "--mode", "test", "--load_checkpoint_path", str(tmp_path / "bare.pth"),
               log="bare.json")
    assert bare["hr@10"] == tested["hr@10"]


def test_resume_is_bit_exact(tiny_data, tmp_path):
    args = ["--dropout", "0.3", "-n", "2", "-b", "2048"]
    full = run(tiny_data, tmp_path, "-e", "3", "--checkpoint_dir", str(tmp_path / "a"), *args, log="a.json")
    # "interrupted" after epoch 1 (two epochs done), then resumed to 3 epochs
    run(tiny_data, tmp_path, "-e", "2", "--checkpoint_dir", str(tmp_path / "b"), *args, log="b1.json")
    resumed = run(tiny_data, tmp_path, "-e", "3", "--checkpoint_dir", str(tmp_path / "b"), "--resume", *args,
                  log="b2.json")
    a = torch.load(tmp_path / "a" / "last.pth", weights_only=True)
    b = torch.load(tmp_path / "b" / "last.pth", weights_only=True)
    for name, tensor in a["model"].items():
        assert torch.equal(tensor, b["model"][name]), name
    for key in ("best_hr@10", "best_ndcg@10", "best_epoch"):
        assert full[key] == resumed[key]
    assert full["last"]["loss"] == resumed["last"]["loss"]
    assert [r["step"] for r in read_log(str(tmp_path / "b2.json"))][1] == [2]  # only epoch 2 was run
    # another model configuration is refused, naming each differing field and the flag that sets it
    with pytest.raises(ncf_checkpointing.CheckpointError, match=r"dropout: checkpoint 0\.3, flags 0\.5 \(set by --dropout\)"):
        run(tiny_data, tmp_path, "-e", "4", "--checkpoint_dir", str(tmp_path / "b"), "--resume", *args,
            "--dropout", "0.5", log="b3.json")


def _adam_steps(path):
    state = torch.load(path, weights_only=True)["optimizer"]["state"]
    return {int(v["step"]) for v in state.values()}


def test_gradient_accumulation_steps_once_per_n_batches_as_nvidia(tiny_data, tmp_path):
    """NVIDIA's --grads_accumulated N: one optimizer step per N batches of -b rows (N x the batch per step).

    The epoch is one permutation sliced into batches, so 4 batches of 512 rows are exactly the rows of one batch of
    2048, and the step's gradient is the mean over all of them: the two runs train the same model.
    """
    one = run(tiny_data, tmp_path, "-e", "1", "--dropout", "0", "-b", "2048", "--checkpoint_dir", str(tmp_path / "one"),
              "--select_on", "test")   # every training row: the step count below
    acc = run(tiny_data, tmp_path, "-e", "1", "--dropout", "0", "-b", "512", "--grads_accumulated", "4",
              "--checkpoint_dir", str(tmp_path / "acc"), "--select_on", "test", log="acc.json")
    rows = len(load_dataset(tiny_data).train_users) * 5  # positives + 4 negatives each
    assert _adam_steps(tmp_path / "one" / "last.pth") == _adam_steps(tmp_path / "acc" / "last.pth") == \
        {math.ceil(rows / 2048)}
    a = torch.load(tmp_path / "one" / "last.pth", weights_only=True)["model"]
    b = torch.load(tmp_path / "acc" / "last.pth", weights_only=True)["model"]
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-4, atol=1e-5)
    assert one["best_hr@10"] == pytest.approx(acc["best_hr@10"], abs=0.01)
    # the same -b with N = 4 takes 4 times fewer steps (the old micro-batch split kept the step count)
    run(tiny_data, tmp_path, "-e", "1", "--dropout", "0", "-b", "2048", "--grads_accumulated", "4",
        "--checkpoint_dir", str(tmp_path / "big"), "--select_on", "test", log="big.json")
    assert _adam_steps(tmp_path / "big" / "last.pth") == {math.ceil(math.ceil(rows / 2048) / 4)}


def test_bf16_autocast_on_cpu(tiny_data, tmp_path):
    summary = run(tiny_data, tmp_path, "-e", "2", "--amp", "--dropout", "0")
    assert summary["best_hr@10"] > 0.45  # fp32 reaches 0.598 after two epochs


def test_checkpoint_from_another_configuration_names_the_shapes(tiny_data, tmp_path):
    ckpt = tmp_path / "ckpt"
    run(tiny_data, tmp_path, "-e", "1", "-n", "1", "-b", "2048", "--checkpoint_dir", str(ckpt))
    with pytest.raises(ncf_checkpointing.CheckpointError) as error:
        ncf_train.main(["--data", tiny_data, *SMALL, "-f", "16", "--mode", "test", "--log_path", str(tmp_path / "x.json"),
                  "--load_checkpoint_path", str(ckpt / "model.pth")])
    err = str(error.value)
    assert "model.pth: checkpoint does not match" in err
    assert "gmf.user_embedding.weight: shape [500, 8] in the checkpoint, [500, 16] for this configuration" in err
    with pytest.raises(ncf_checkpointing.CheckpointError, match=re.escape("mlp.mlp.0.weight: in the checkpoint (shape [8, 16]) but "
                                                            "not in this model")):
        ncf_train.main(["--data", tiny_data, *SMALL, "--model", "gmf", "--mode", "test", "--log_path", str(tmp_path / "y.json"),
                  "--load_checkpoint_path", str(ckpt / "model.pth")])


def test_missing_dataset_is_a_clear_error(tmp_path):
    with pytest.raises(ncf_train.INPUT_ERRORS, match="nowhere/feature_spec.yaml: feature spec not found"):
        ncf_train.main(["--data", str(tmp_path / "nowhere"), "--log_path", str(tmp_path / "l.json")])


def test_local_rank_spellings():
    assert ncf_cli.parse_args(["--data", "x", "--local-rank", "1"]).local_rank == 1
    assert ncf_cli.parse_args(["--data", "x", "--local_rank", "2"]).local_rank == 2


def test_seed_defaults_and_short_flags():
    a = ncf_cli.parse_args(["--data", "d"])
    assert (a.epochs, a.batch_size, a.valid_batch_size, a.factors, a.layers, a.negative_samples) == \
        (30, 2 ** 20, 2 ** 20, 64, [256, 256, 128, 64], 4)
    assert (a.learning_rate, a.topk, a.seed, a.threshold, a.beta1, a.beta2, a.eps, a.dropout) == \
        (0.0045, 10, None, 1.0, 0.25, 0.5, 1e-8, 0.5)
    assert (a.checkpoint_dir, a.load_checkpoint_path, a.mode, a.grads_accumulated, a.amp, a.log_path) == \
        ("", None, "train", 1, False, "log.json")
    assert a.feature_spec_file == "feature_spec.yaml"
    b = ncf_cli.parse_args(["--data", "d", "-e", "2", "-b", "8", "-f", "4", "-n", "1", "-l", "0.1", "-k", "5", "-s", "7",
                        "-t", "0.5", "-b1", "0.8", "-b2", "0.9"])
    assert (b.epochs, b.batch_size, b.factors, b.negative_samples, b.learning_rate, b.topk, b.seed, b.threshold,
            b.beta1, b.beta2) == (2, 8, 4, 1, 0.1, 5, 7, 0.5, 0.8, 0.9)


def test_readme_flag_table_matches_the_parser():
    """Every row of the README's ncf.py flag table names a real option with the parser's default, and vice versa."""
    with open(os.path.join(NCF_DIR, "README.md")) as f:
        text = f.read()
    table = text.split("<!-- ncf-flags-start -->")[1].split("<!-- ncf-flags-end -->")[0]
    rows = re.findall(r"^\| `([^`]+)` \| `([^`]*)` \|", table, flags=re.M)
    parser_actions = {}
    parser = ncf_cli.build_parser()
    for action in parser._actions:
        if action.dest == "help":
            continue
        parser_actions[", ".join(action.option_strings)] = action
    documented = {flags: default for flags, default in rows}
    assert set(documented) == set(parser_actions), set(documented) ^ set(parser_actions)
    for flags, default in documented.items():
        action = parser_actions[flags]
        expected = action.default
        if isinstance(expected, list):
            expected = " ".join(map(str, expected))
        assert default == ("" if expected is None else str(expected)) or \
            (expected is None and default == "None"), (flags, default, action.default)
