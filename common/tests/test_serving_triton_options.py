"""One options object for every Triton exporter: the batching delay in one unit (microseconds) whichever flag gave it,
NVIDIA's "off" values, refusals naming the flag; the dash/underscore flag spellings; the shared PyTorch export."""
import argparse

import numpy as np
import pytest

from recsys_common.flags import add_flag
from recsys_common.serving.triton_options import (TritonOptions, TritonOptionsError, add_batching_delay_arguments,
                                                  add_triton_arguments, triton_options)


def _options(*argv):
    p = argparse.ArgumentParser()
    add_triton_arguments(p, default_model_name="m")
    return triton_options(p.parse_args(list(argv)))


@pytest.mark.parametrize("argv, delay_us", [
    ((), None),                                              # default: no dynamic batcher
    (("--triton-dyn-batching-delay", "0.5"), 500),           # NVIDIA's flag is milliseconds
    (("--triton-dyn-batching-delay", "2"), 2000),
    (("--triton-dyn-batching-delay", "0.0004"), 0),          # rounds to whole microseconds: batcher on, no wait
    (("--triton-dyn-batching-delay", "0"), None),            # NVIDIA's "off" values
    (("--triton-dyn-batching-delay", "-1"), None),
    (("--dynamic-batching-delay-us", "500"), 500),           # TF2 DLRM's flag is microseconds
    (("--max-queue-delay-us", "250"), 250),                  # Wide & Deep's spelling of it
    (("--dynamic-batching-delay-us", "0"), 0),               # 0 us: batcher on, no wait (not "off")
    (("--triton-dyn-batching-delay", "0.5", "--max-queue-delay-us", "20"), 20),   # the last one given wins
])
def test_batching_delay_is_held_in_microseconds(argv, delay_us):
    options = _options(*argv)
    assert options.dynamic_batching_delay_us == delay_us
    assert options.preferred_batch_sizes == (None if delay_us is None else [32768, 65536])


@pytest.mark.parametrize("argv, message", [
    (("--triton-dyn-batching-delay", "-2"), "--triton-dyn-batching-delay: .* 0 / -1 for no dynamic batching"),
    (("--dynamic-batching-delay-us", "-5"), "--dynamic-batching-delay-us: .* >= 0, got -5"),
    (("--max-queue-delay-us", "1.5"), "--max-queue-delay-us: "),
])
def test_bad_delay_is_refused_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        _options(*argv)
    assert exit_info.value.code == 2
    assert __import__("re").search(message, capsys.readouterr().err)


def test_options_refuse_impossible_settings():
    with pytest.raises(TritonOptionsError, match="--triton-max-batch-size must be an integer >= 1, got 0"):
        _options("--triton-max-batch-size", "0")
    with pytest.raises(TritonOptionsError, match="--triton-engine-count must be an integer >= 1, got -1"):
        _options("--triton-engine-count", "-1")
    with pytest.raises(TritonOptionsError, match="--triton-model-version"):
        TritonOptions("m", version=0)
    with pytest.raises(TritonOptionsError, match="--dynamic-batching-delay-us"):
        TritonOptions("m", dynamic_batching_delay_us=-1)
    assert TritonOptions("m", max_batch_size=1, dynamic_batching_delay_us=0).preferred_batch_sizes == [1]
    options = _options("--deploy_cpu", "--model-repository", "/r", "--overwrite", "--triton-engine-count", "3")
    assert (options.instance_kind, options.repository, options.overwrite, options.instance_count) == \
        ("KIND_CPU", "/r", True, 3)
    assert _options().instance_kind == "KIND_GPU"   # NVIDIA's default


def test_tool_default_delay():
    """Wide & Deep's export batches dynamically by default (0 us): a tool passes its own default."""
    p = argparse.ArgumentParser()
    add_batching_delay_arguments(p, default_us=0)
    assert p.parse_args([]).dynamic_batching_delay_us == 0
    assert p.parse_args(["--triton-dyn-batching-delay", "0"]).dynamic_batching_delay_us is None


def test_flag_spellings():
    p = argparse.ArgumentParser()
    add_flag(p, "--server-url", default="127.0.0.1:8001")
    add_flag(p, "--model_name", default=None)
    assert p.parse_args(["--server_url", "a:1"]).server_url == "a:1"
    assert p.parse_args(["--server-url", "b:2"]).server_url == "b:2"
    assert p.parse_args(["--model-name", "x"]).model_name == "x"
    assert p.parse_args(["--model_name", "y"]).model_name == "y"
    assert p.parse_args([]).server_url == "127.0.0.1:8001"


def test_latency_flags_take_both_spellings():
    from recsys_common.serving.latency import add_latency_arguments
    p = argparse.ArgumentParser()
    add_latency_arguments(p, default_model_name="m")
    args = p.parse_args(["--server_url", "h:9", "--model_name", "x", "--output_json", "o.json"])
    assert (args.server_url, args.model_name, args.output_json) == ("h:9", "x", "o.json")
    assert p.parse_args(["--server-url", "h:8"]).server_url == "h:8"


def test_random_rows_follow_the_sidecar():
    from recsys_common.serving.rows import UNBOUNDED_IDS, cycling_rows, random_rows
    inputs = {"numerical": {"dtype": "float32", "dims": [3], "max_id": None},
              "categorical": {"dtype": "int64", "dims": [3], "max_id": [2, 50, 7]},
              "hashed": {"dtype": "int64", "dims": [1], "max_id": None},
              "multi": {"dtype": "int64", "dims": [4], "max_id": 9, "min_id": -1},
              "single": {"dtype": "int32", "dims": [1], "max_id": 5, "min_id": 0}}
    rows = random_rows(inputs, 2000, seed=3)
    assert rows["numerical"].dtype == np.float32 and abs(float(rows["numerical"].std()) - 1) < 0.05
    assert [int(rows["categorical"][:, j].max()) for j in range(3)] == [1, 49, 6]   # each column its own table
    assert rows["categorical"].min() == 0 and rows["hashed"].max() < UNBOUNDED_IDS
    multi = rows["multi"]
    assert (multi[:, 0] >= 0).all() and multi.max() == 8              # at least one id per row
    padded = multi == -1
    assert padded.any() and not (padded[:, :-1] & ~padded[:, 1:]).any()   # padding only after the ids
    assert rows["single"].dtype == np.int32 and rows["single"].shape == (2000, 1)
    np.testing.assert_array_equal(random_rows(inputs, 5, seed=3)["multi"], random_rows(inputs, 5, seed=3)["multi"])
    make = cycling_rows({"a": np.arange(5)})
    assert make(3)["a"].tolist() == [0, 1, 2] and make(4)["a"].tolist() == [3, 4, 0, 1]


def test_torch_export_writes_the_delay_and_matches_eager(tmp_path):
    """The shared PyTorch export: the same microseconds in config.pbtxt from either flag, preferred batch sizes, and
    the exported-vs-eager check near 0 for ONNX and TorchScript."""
    torch = pytest.importorskip("torch")
    from recsys_common.serving import torch_export
    from recsys_common.serving.model_config import check_model_directory

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(10, 3)

        def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
            return torch.sigmoid((x * self.table(ids[:, 0])).sum(dim=1, keepdim=True))

    torch.manual_seed(0)
    module = Tiny().eval()
    sidecar = {"recipe": "test", "inputs": {"x": {"dtype": "float32", "dims": [3], "max_id": None},
                                            "ids": {"dtype": "int64", "dims": [1], "max_id": 10}},
               "outputs": ["probability"]}
    configs = {}
    for flag, value in (("--triton-dyn-batching-delay", "0.25"), ("--dynamic-batching-delay-us", "250")):
        options = _options("--triton-model-name", "tiny", "--triton-max-batch-size", "64", flag, value,
                           "--deploy_cpu", "--save-dir", str(tmp_path / flag.strip("-")))
        dirs = torch_export.write_repository(module, sidecar, ["onnx", "ts-trace"], options, tool="test")
        configs[flag] = check_model_directory(dirs[0])
        assert [d.rsplit("/", 1)[-1] for d in dirs] == ["tiny-onnx", "tiny-ts"]
        diffs = torch_export.check_exported(module, dirs, 1, torch_export.random_rows(sidecar["inputs"], 50, 1))
        assert max(diffs.values()) < 1e-6, diffs
    for config in configs.values():
        assert config.dynamic_batching.max_queue_delay_microseconds == 250
        assert list(config.dynamic_batching.preferred_batch_size) == [32, 64]
    with pytest.raises(torch_export.ExportError, match="choose one"):
        torch_export.selected_formats(False, True, True)
    assert torch_export.selected_formats(False, False, False) == ["onnx", "ts-script"]


def test_pytorch_export_path_imports_no_tensorflow():
    """The PyTorch recipes run on GPU machines with torch but without TensorFlow: the shared export modules must not
    pull it in (a fresh interpreter, so that no other test's import hides it)."""
    import subprocess
    import sys
    code = ("import sys; import recsys_common.serving.torch_export, recsys_common.serving.triton_options, "
            "recsys_common.serving.rows, recsys_common.serving.latency, recsys_common.flags; "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'tf_keras', "
            "'torchrec', 'fbgemm_gpu')); print(bad); sys.exit(1 if bad else 0)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
