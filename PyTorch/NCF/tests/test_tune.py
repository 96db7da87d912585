"""ncf.py --tune: trials on the validation split within a budget, a table, the best trained fully."""
import pytest

from neumf import train as ncf_train
from neumf.cli import ConfigurationError
from recsys_common.logger import read_log

SMALL = ["-b", "512", "-b1", "0.9", "-b2", "0.999", "-f", "8", "--layers", "16", "8", "--valid_batch_size", "5000",
         "--seed", "3", "--dropout", "0", "-l", "0.002"]


def test_tune_tries_rates_then_trains_the_best(tiny_data, tmp_path, capsys):
    summary = ncf_train.main(["--data", tiny_data, *SMALL, "-e", "2", "--tune", "--tune_epochs", "1",
                              "--tune_budget_s", "600", "--log_path", str(tmp_path / "log.json")])
    trials = summary["tune"]
    # all four rates, then the walk; every trial scored on validation, the chosen one the best of them
    assert [t["learning_rate"] for t in trials[:4]] == [0.002, 0.001, 0.004, 0.008]
    assert len(trials) >= 5 and all(0 < t["valid_hr"] <= 1 and t["seconds"] > 0 for t in trials)
    best = max(trials, key=lambda t: t["valid_hr"])
    params = read_log(str(tmp_path / "log.json"))[0]["data"]
    assert (params["learning_rate"], params["negative_samples"], params["factors"]) == \
        (best["learning_rate"], best["negative_samples"], best["factors"])
    # on this data 1 epoch at 0.002 is far from trained (validation HR near popularity's): a faster rate must win
    assert best["learning_rate"] > 0.002 and summary["selected_on"] == "validation"
    out = capsys.readouterr().out
    assert "ncf.py --tune: trial 1: -l 0.002 -n 4 -f 8: validation HR" in out
    assert "| -l | -n | -f | validation HR | best epoch | seconds |" in out and "(chosen)" in out


def test_tune_stops_at_its_budget(tiny_data, tmp_path):
    summary = ncf_train.main(["--data", tiny_data, *SMALL, "-e", "1", "--tune", "--tune_epochs", "1",
                              "--tune_budget_s", "0.001", "--log_path", str(tmp_path / "log.json")])
    assert [t["learning_rate"] for t in summary["tune"]] == [0.002]   # the first trial always runs, then none fits


def test_tune_refuses_what_it_cannot_do(tiny_data, tmp_path, monkeypatch):
    with pytest.raises(SystemExit):
        ncf_train.main(["--data", tiny_data, "--tune", "--select_on", "test"])
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ConfigurationError, match="--tune runs in one process"):
        ncf_train.main(["--data", tiny_data, *SMALL, "--tune", "--log_path", str(tmp_path / "log.json")])
