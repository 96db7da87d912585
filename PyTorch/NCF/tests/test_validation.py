"""Model selection on a validation item per user (the NCF paper's protocol), NVIDIA's best-of-test behind a flag."""
import numpy as np
import pytest
import torch

from neumf import cli as ncf_cli, train as ncf_train
from neumf.data import NCFData, hold_out_validation
from recsys_common.logger import read_log

SMALL = ["-b", "512", "-b1", "0.9", "-b2", "0.999", "-f", "8", "--layers", "16", "8", "--valid_batch_size", "5000",
         "--seed", "3", "--dropout", "0"]


def toy_data():
    # user 0: rows 0, 2, 4 (items 1, 2, 3: item 3 is its latest); user 1: one row; user 2: rows 3, 5 (items 4, 0)
    return NCFData(train_users=np.array([0, 1, 0, 2, 0, 2]), train_items=np.array([1, 5, 2, 4, 3, 0]),
                   test_users=np.repeat([0, 1, 2], 4), test_items=np.array([6, 7, 8, 9, 6, 0, 1, 2, 1, 2, 3, 5]),
                   test_labels=np.tile(np.array([1, 0, 0, 0], dtype=np.float32), 3), num_users=3, num_items=10,
                   samples_per_series=4)


def test_latest_training_row_is_held_out_with_unknown_negatives():
    data = toy_data()
    training, validation = hold_out_validation(data)
    # the last row of users 0 and 2 left training; user 1 has a single row and keeps it (no validation series)
    assert training.train_users.tolist() == [0, 1, 0, 2] and training.train_items.tolist() == [1, 5, 2, 4]
    series = validation.test_items.reshape(-1, 4)
    assert validation.test_users.reshape(-1, 4)[:, 0].tolist() == [0, 2]
    assert series[:, 0].tolist() == [3, 0] and validation.test_labels.reshape(-1, 4)[:, 0].tolist() == [1, 1]
    known = {0: {1, 2, 3, 6}, 2: {4, 0, 1}}   # training items and the test positive are never drawn as negatives
    for user, negatives in zip((0, 2), series[:, 1:]):
        assert not set(negatives.tolist()) & known[user]
    # the same split every time (a fixed seed: it belongs to the dataset), the test series untouched
    again = hold_out_validation(data)[1]
    assert np.array_equal(again.test_items, validation.test_items)
    assert np.array_equal(training.test_items, data.test_items)


def test_best_epoch_is_chosen_on_validation_and_its_test_hr_reported(tiny_data, tmp_path):
    summary = ncf_train.main(["--data", tiny_data, *SMALL, "-l", "0.01", "-e", "4", "--early_stop_patience", "0",
                              "--checkpoint_dir", str(tmp_path / "ck"), "--log_path", str(tmp_path / "log.json")])
    epochs = [r["data"] for r in read_log(str(tmp_path / "log.json")) if r["step"] not in ("PARAMETER", [])]
    assert summary["selected_on"] == "validation" and len(epochs) == 4
    chosen = max(epochs, key=lambda e: e["valid_hr@10"])   # the first best: later ties do not replace it
    assert summary["best_epoch"] == chosen["epoch"] and summary["best_valid_hr@10"] == chosen["valid_hr@10"]
    assert summary["best_hr@10"] == chosen["hr@10"]         # the test HR at that epoch, not the best test HR
    assert torch.load(tmp_path / "ck" / "model.pth", weights_only=True)["epoch"] == chosen["epoch"]
    assert chosen["valid_hr@10"] > 0.5 and chosen["hr@10"] > 0.5   # both learn: chance is 0.1


def test_early_stopping_after_patience_epochs_without_a_better_validation_hr(tiny_data, tmp_path):
    # -l 0: nothing changes after epoch 0, so epochs 1 and 2 are the two without improvement, then it stops
    summary = ncf_train.main(["--data", tiny_data, *SMALL, "-l", "0", "-e", "10", "--early_stop_patience", "2",
                              "--log_path", str(tmp_path / "log.json")])
    assert summary["best_epoch"] == 0 and summary["last"]["epoch"] == 2


def test_select_on_test_keeps_nvidias_behaviour(tiny_data, tmp_path):
    summary = ncf_train.main(["--data", tiny_data, *SMALL, "-l", "0.01", "-e", "2", "--select_on", "test",
                              "--log_path", str(tmp_path / "log.json")])
    epochs = [r["data"] for r in read_log(str(tmp_path / "log.json")) if r["step"] not in ("PARAMETER", [])]
    assert summary["selected_on"] == "test" and "valid_hr@10" not in epochs[0]
    assert summary["best_hr@10"] == max(e["hr@10"] for e in epochs)


@pytest.mark.parametrize("select_on, device, expected", [
    ("auto", "cpu", "validation"), ("auto", "cuda", "test"), ("test", "cpu", "test"),
    ("validation", "cuda", "validation")])
def test_auto_is_validation_on_cpu_and_nvidias_on_gpu(select_on, device, expected):
    assert ncf_cli.selection_protocol(select_on, torch.device(device)) == expected


def test_a_model_below_popularity_on_validation_is_said_out_loud(tiny_data, tmp_path, capsys):
    # -l 0: the model stays at its random start, far below popularity on the validation series
    summary = ncf_train.main(["--data", tiny_data, *SMALL, "-l", "0", "-e", "1", "--log_path", str(tmp_path / "l.json")])
    assert summary["popularity_valid_hr@10"] > summary["best_valid_hr@10"]
    assert "does not beat popularity's" in capsys.readouterr().out
    trained = ncf_train.main(["--data", tiny_data, *SMALL, "-l", "0.01", "-e", "3", "--log_path",
                              str(tmp_path / "t.json")])
    assert trained["best_valid_hr@10"] > trained["popularity_valid_hr@10"]
    assert "does not beat popularity's" not in capsys.readouterr().out
