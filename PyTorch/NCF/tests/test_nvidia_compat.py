"""Moving from NVIDIA's NCF recipe: its bare ``model.pth`` loads (and ours exports to its layout), and a dataset made
by its ``convert.py`` (``torch_tensor`` chunks) trains unchanged.

The fixtures are built the way NVIDIA's code builds them (DeepLearningExamples PyTorch/Recommendation/NCF):
``neumf.py`` names the parameters ``mf_user_embed``, ``mf_item_embed``, ``mlp_user_embed``, ``mlp_item_embed``,
``mlp.<k>`` (an ``nn.ModuleList`` of the Linear layers only) and ``final``; ``convert.py`` saves
``train_data_0.pt`` (int64 ``[P, 2]`` user, item), ``train_data_1.pt`` (float32 ``[P, 1]`` label),
``test_data_0.pt`` / ``test_data_1.pt`` (the same for the ``1 + valid_negative`` candidates per user, positive
first) and ``feature_spec.yaml`` with dtypes ``torch.int64`` / ``torch.float32`` and two chunks per mapping.
"""
import os
from contextlib import nullcontext

import numpy as np
import pytest
import torch
import yaml
from torch import nn

from neumf.data import convert
import export_nvidia_checkpoint
from neumf import checkpointing as ncf_checkpointing, evaluation as ncf_evaluation, train as ncf_train
from neumf.data import EvalSet, load_dataset
from neumf import NeuMF, build_model, to_nvidia_state_dict
from recsys_common.cli import exit_status

FACTORS, LAYERS = 8, [16, 8, 4]
SMALL = ["-b", "2048", "-n", "1", "-l", "0.01", "-b1", "0.9", "-b2", "0.999", "-f", str(FACTORS),
         "--layers", *map(str, LAYERS), "--valid_batch_size", "5000", "--seed", "3"]


def export_cli(argv):
    """``python export_nvidia_checkpoint.py ARGV``'s exit status."""
    return exit_status(export_nvidia_checkpoint.main, argv, prog="export_nvidia_checkpoint.py",
                       input_errors=(ncf_checkpointing.CheckpointError,))


def nvidia_state_dict(num_users, num_items, factors=FACTORS, layers=LAYERS, seed=0):
    """Random weights under the names and shapes NVIDIA's ``NeuMF(nb_users, nb_items, mf_dim, mlp_layer_sizes)`` has."""
    g = torch.Generator().manual_seed(seed)

    def rand(*shape):
        return torch.randn(*shape, generator=g) * 0.3
    state = {"mf_user_embed.weight": rand(num_users, factors), "mf_item_embed.weight": rand(num_items, factors),
             "mlp_user_embed.weight": rand(num_users, layers[0] // 2),
             "mlp_item_embed.weight": rand(num_items, layers[0] // 2)}
    for k, (width_in, width_out) in enumerate(zip(layers[:-1], layers[1:])):
        state[f"mlp.{k}.weight"], state[f"mlp.{k}.bias"] = rand(width_out, width_in), rand(width_out)
    state["final.weight"], state["final.bias"] = rand(1, layers[-1] + factors), rand(1)
    return state


def nvidia_forward(state, users, items):
    """NVIDIA's NeuMF.forward in evaluation mode, written out: [mf_u * mf_i ; relu-MLP([mlp_u ; mlp_i])] -> final."""
    mf = state["mf_user_embed.weight"][users] * state["mf_item_embed.weight"][items]
    x = torch.cat([state["mlp_user_embed.weight"][users], state["mlp_item_embed.weight"][items]], dim=1)
    k = 0
    while f"mlp.{k}.weight" in state:
        x = torch.relu(x @ state[f"mlp.{k}.weight"].T + state[f"mlp.{k}.bias"])
        k += 1
    return (torch.cat([mf, x], dim=1) @ state["final.weight"].T + state["final.bias"]).squeeze(1)


class NvidiaReference(nn.Module):
    def __init__(self, state):
        super().__init__()
        self.state = state

    def forward(self, users, items):
        return nvidia_forward(self.state, users, items)


@pytest.mark.parametrize("dropout", [0.0, 0.5])  # dropout changes where the Linear layers sit in our Sequential
@pytest.mark.parametrize("prefix", ["", "module."])  # NVIDIA saves model.state_dict() of its DDP wrapper
def test_a_bare_nvidia_state_dict_loads_and_computes_the_same_scores(dropout, prefix):
    state = nvidia_state_dict(7, 9)
    model = NeuMF(7, 9, FACTORS, LAYERS, dropout)
    ncf_checkpointing.load_model_weights(model, {prefix + k: v for k, v in state.items()}, "nvidia/model.pth")
    users, items = torch.tensor([0, 3, 6, 6]), torch.tensor([8, 0, 4, 5])
    torch.testing.assert_close(model.eval()(users, items), nvidia_forward(state, users, items))


def test_export_to_nvidia_names_is_the_inverse(tmp_path):
    state = nvidia_state_dict(7, 9)
    model = NeuMF(7, 9, FACTORS, LAYERS, dropout=0.5)
    ncf_checkpointing.load_model_weights(model, state, "nvidia.pth")
    exported = to_nvidia_state_dict(model.state_dict())
    assert set(exported) == set(state)
    for name, tensor in state.items():
        assert torch.equal(exported[name], tensor), name


def test_nvidia_checkpoint_into_another_model_is_a_clear_error():
    with pytest.raises(ncf_checkpointing.CheckpointError, match="NVIDIA's checkpoints hold a NeuMF model"):
        ncf_checkpointing.load_model_weights(build_model("gmf", 7, 9, FACTORS, LAYERS, 0.0), nvidia_state_dict(7, 9), "n.pth")
    # fewer --layers than the checkpoint: NVIDIA's extra layer is named as it is in the file
    with pytest.raises(ncf_checkpointing.CheckpointError, match=r"mlp.1.weight: in the checkpoint \(shape \[4, 8\]\) but not in"):
        ncf_checkpointing.load_model_weights(NeuMF(7, 9, FACTORS, LAYERS[:-1], 0.5), nvidia_state_dict(7, 9), "n.pth")


def test_ncf_evaluates_a_bare_nvidia_model_pth_and_exports_its_own(tiny_data, tmp_path, capsys):
    data = load_dataset(tiny_data)
    state = nvidia_state_dict(data.num_users, data.num_items)
    torch.save(state, tmp_path / "model.pth")  # what NVIDIA's ncf.py writes: torch.save(model.state_dict(), ...)
    tested = ncf_train.main(["--data", tiny_data, *SMALL, "--mode", "test", "--load_checkpoint_path",
                       str(tmp_path / "model.pth"), "--log_path", str(tmp_path / "test.json")])
    expected = ncf_evaluation.evaluate(NvidiaReference(state), EvalSet(data, 0, 1, torch.device("cpu")), 10, 5000, nullcontext)
    assert tested["hr@10"] == expected["hr"] and tested["ndcg@10"] == pytest.approx(expected["ndcg"], abs=1e-12)

    # train from it, then hand our best checkpoint back to NVIDIA's layout
    ckpt = tmp_path / "ours"
    ncf_train.main(["--data", tiny_data, *SMALL, "-e", "1", "--load_checkpoint_path", str(tmp_path / "model.pth"),
              "--checkpoint_dir", str(ckpt), "--log_path", str(tmp_path / "train.json")])
    out = tmp_path / "nvidia" / "model.pth"
    assert export_cli(["--input", str(ckpt / "model.pth"), "--output", str(out)]) == 0
    exported = torch.load(out, weights_only=True)
    assert set(exported) == set(state)
    ours = torch.load(ckpt / "model.pth", weights_only=True)["model"]
    assert torch.equal(exported["mlp.1.weight"], ours["mlp.mlp.3.weight"])  # dropout 0.5: Linear, ReLU, Dropout
    assert torch.equal(exported["final.bias"], ours["predictor.linear.bias"])
    # an existing output is never replaced
    assert export_cli(["--input", str(ckpt / "model.pth"), "--output", str(out)]) == 2
    assert "exists; refusing to overwrite it" in capsys.readouterr().err


def write_nvidia_dataset(split, directory):
    """The files and feature_spec.yaml NVIDIA's convert.py writes (torch.save of int64 / float32 2-D tensors)."""
    os.makedirs(directory)
    samples = split.test_candidates.shape[1]
    train = torch.from_numpy(np.stack([split.train_users, split.train_items], axis=1).astype(np.int64))
    test_users = torch.from_numpy(np.repeat(split.test_users, samples).astype(np.int64)).reshape(-1, 1)
    test_items = torch.from_numpy(split.test_candidates.astype(np.int64)).reshape(-1, 1)
    test_labels = torch.zeros(split.test_candidates.shape, dtype=torch.float32)
    test_labels[:, 0] = 1
    torch.save(train, os.path.join(directory, "train_data_0.pt"))
    torch.save(torch.ones_like(train[:, 0:1], dtype=torch.float32), os.path.join(directory, "train_data_1.pt"))
    torch.save(torch.cat([test_users, test_items], dim=1), os.path.join(directory, "test_data_0.pt"))
    torch.save(test_labels.reshape(-1, 1), os.path.join(directory, "test_data_1.pt"))
    spec = {
        "feature_spec": {"user": {"dtype": "torch.int64", "cardinality": int(split.num_users)},
                         "item": {"dtype": "torch.int64", "cardinality": int(split.num_items)},
                         "label": {"dtype": "torch.float32"}},
        "metadata": {"test_samples_per_series": samples},
        "source_spec": {
            "train": [{"type": "torch_tensor", "features": ["user", "item"], "files": ["train_data_0.pt"]},
                      {"type": "torch_tensor", "features": ["label"], "files": ["train_data_1.pt"]}],
            "test": [{"type": "torch_tensor", "features": ["user", "item"], "files": ["test_data_0.pt"]},
                     {"type": "torch_tensor", "features": ["label"], "files": ["test_data_1.pt"]}]},
        "channel_spec": {"user_ch": ["user"], "item_ch": ["item"], "label_ch": ["label"]},
    }
    with open(os.path.join(directory, "feature_spec.yaml"), "w") as f:
        print(yaml.dump(spec), file=f)  # NVIDIA's FeatureSpec.to_yaml
    return directory


def test_a_dataset_made_by_nvidias_converter_trains_like_ours(tmp_path):
    raw = tmp_path / "ratings.csv"
    lines = [f"{u},{i},{u * 1000 + i}" for u in range(1, 41) for i in range(1 + u % 7, 60, 3)]
    raw.write_text("user_id,item_id,timestamp\n" + "\n".join(lines) + "\n")
    split = convert.convert_ratings(str(raw), valid_negative=20, seed=1)
    ours = str(tmp_path / "parquet")
    convert.write_split(split, ours)
    theirs = write_nvidia_dataset(split, str(tmp_path / "torch_tensor"))
    a, b = load_dataset(ours), load_dataset(theirs)
    assert (b.num_users, b.num_items, b.samples_per_series) == (a.num_users, a.num_items, 21)
    for field in ("train_users", "train_items", "test_users", "test_items", "test_labels"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field), err_msg=field)
    argv = ["-e", "2", "-b", "256", "-f", "4", "--layers", "8", "4", "--seed", "5", "-k", "5"]
    on_ours = ncf_train.main(["--data", ours, *argv, "--log_path", str(tmp_path / "a.json")])
    on_theirs = ncf_train.main(["--data", theirs, *argv, "--log_path", str(tmp_path / "b.json")])
    assert on_theirs["best_hr@5"] == on_ours["best_hr@5"] and on_theirs["last"]["loss"] == on_ours["last"]["loss"]


def test_inference_loads_a_bare_nvidia_model_pth(tmp_path):
    import inference
    torch.save({"module." + k: v for k, v in nvidia_state_dict(50, 40).items()}, tmp_path / "model.pth")
    rows = inference.main(["--load_checkpoint_path", str(tmp_path / "model.pth"), "--n_users", "50", "--n_items", "40",
                           "--factors", str(FACTORS), "--layers", *map(str, LAYERS), "--batch_sizes", "8",
                           "--num_batches", "2", "--num_warmup", "0", "--log_path", str(tmp_path / "inf.json")])
    assert [r["batch_size"] for r in rows] == [8]
