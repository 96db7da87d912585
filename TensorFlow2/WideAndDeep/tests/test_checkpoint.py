"""Atomic periodic checkpoints: a run killed with SIGKILL resumes from its last checkpoint with --use_checkpoint and
ends with the weights and metrics of an uninterrupted run; --evaluate --use_checkpoint reads it back."""
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import RECIPE_DIR, subprocess_env
from recsys_common.logger import read_log
from wide_deep.model import network as model_module
from wide_deep.train import TrainingError, main


def flags(dataset, out, emb, shuffle=False, dropout="0"):
    return ["--dataset_path", dataset, "--cpu", "--global_batch_size", "256", "--eval_batch_size", "2048",
            "--num_epochs", "2", "--deep_warmup_epochs", "1", "--deep_hidden_units", "16", "16", "--deep_dropout", dropout,
            "--deep_learning_rate", "0.01", "--embedding_sizes_file", emb, "--results_dir", str(out / "results"),
            "--model_dir", str(out / "model"), "--checkpoint_every_steps", "10"] + ([] if shuffle else ["--no_shuffle"])


@pytest.fixture
def captured_models(monkeypatch):
    models = []
    original = model_module.WideDeepModel.__init__

    def init(self, *args, **kwargs):
        original(self, *args, **kwargs)
        models.append(self)
    monkeypatch.setattr(model_module.WideDeepModel, "__init__", init)
    return models


def weights(model):
    """Variables keyed by position and last name part (a second model in a process gets another name scope)."""
    return {f"{i}:{v.name.split('/')[-1]}": v.numpy() for i, v in enumerate(model.variables)}


def summary(out):
    return [r["data"] for r in read_log(str(out / "results" / "log.json")) if r["step"] == []][-1]


def test_sigkill_resume_is_exact(etl_training, tmp_path, captured_models):
    """With the default shuffled batch order (each epoch's order seeded by --seed and the epoch, so a resumed run
    skips exactly the batches the killed one trained on) and dropout (the masks' random streams are in the
    checkpoint, so the resumed run draws the masks the uninterrupted one drew)."""
    from wide_deep.data.outbrain.features import EMBEDDING_SIZES
    emb = tmp_path / "emb.json"
    emb.write_text(json.dumps({name: 4 for name in EMBEDDING_SIZES}))
    full, killed = tmp_path / "full", tmp_path / "killed"
    main(flags(etl_training, full, str(emb), shuffle=True, dropout="0.2"))
    reference = weights(captured_models[-1])

    meta = killed / "model" / "checkpoint" / "meta.json"
    proc = subprocess.Popen([sys.executable, "main.py"] + flags(etl_training, killed, str(emb), shuffle=True, dropout="0.2"),
                            cwd=RECIPE_DIR,
                            env=subprocess_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.time() + 240
        while not meta.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, "the run finished before it could be killed"
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    killed_at = json.loads(meta.read_text())["step"]
    assert 10 <= killed_at < 62  # 2 epochs of 31 steps: killed part-way

    main(flags(etl_training, killed, str(emb), shuffle=True, dropout="0.2") + ["--use_checkpoint"])
    resumed = weights(captured_models[-1])
    for name, value in reference.items():
        np.testing.assert_allclose(resumed[name], value, rtol=0, atol=1e-6, err_msg=name)
    assert summary(killed) == pytest.approx(summary(full), abs=1e-6)

    # --evaluate --use_checkpoint: the final checkpoint gives the final metrics
    evaluated = main(flags(etl_training, killed, str(emb), shuffle=True, dropout="0.2") + ["--use_checkpoint", "--evaluate"])
    assert evaluated == summary(killed) == pytest.approx(summary(full), abs=1e-6)


def test_use_checkpoint_without_one_is_a_clear_error(etl_training, tmp_path, capsys):
    from wide_deep.data.outbrain.features import EMBEDDING_SIZES
    emb = tmp_path / "emb.json"
    emb.write_text(json.dumps({name: 4 for name in EMBEDDING_SIZES}))
    with pytest.raises(FileNotFoundError, match="no complete checkpoint in"):
        main(flags(etl_training, tmp_path, str(emb)) + ["--use_checkpoint", "--evaluate"])


def test_an_evaluation_that_fails_on_the_data_keeps_the_epochs_checkpoint(etl_training, tmp_path, capsys):
    """A validation display without a click stops the run at the end-of-epoch evaluation (MAP@12 is undefined), but
    the epoch's checkpoint is written first: with the data fixed (here: --disable_map_calculation), the run goes on
    from it instead of training the epoch again."""
    import shutil

    import pyarrow as pa
    import pyarrow.parquet as pq
    from wide_deep.data.outbrain.features import EMBEDDING_SIZES
    emb = tmp_path / "emb.json"
    emb.write_text(json.dumps({name: 4 for name in EMBEDDING_SIZES}))
    dataset = tmp_path / "data"
    shutil.copytree(etl_training, dataset)
    valid = sorted((dataset / "valid").glob("*.parquet"))[0]
    original = pq.read_table(valid)
    table = original.to_pandas()
    display = table["display_id"].iloc[0]
    table.loc[table["display_id"] == display, "clicked"] = 0      # this display now has no clicked ad
    pq.write_table(pa.Table.from_pandas(table, schema=original.schema, preserve_index=False), valid)

    one_epoch = flags(str(dataset), tmp_path, str(emb)) + ["--num_epochs", "1", "--checkpoint_every_steps", "0"]
    with pytest.raises(TrainingError) as error:
        main(one_epoch)
    err = str(error.value)
    assert f"display_id {display} has 0 clicked ads" in err and "evaluation after epoch 1" in err
    assert "--use_checkpoint" in err
    meta = tmp_path / "model" / "checkpoint" / "meta.json"
    assert json.loads(meta.read_text())["step"] == 31                 # the whole epoch (31 steps) was saved
    plot = tmp_path / "reliability.png"
    final = main(one_epoch + ["--use_checkpoint", "--disable_map_calculation", "--reliability_plot", str(plot)])
    assert set(final) == {"eval_loss", "eval_auc", "eval_normalized_entropy", "eval_calibration"}
    assert final["eval_auc"] > 0.55 and 0 < final["eval_normalized_entropy"] < 1.2
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"   # the final evaluation's reliability diagram
