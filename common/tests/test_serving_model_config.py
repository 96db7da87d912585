"""config.pbtxt written through Triton's protobuf, read back, and model directories checked for every platform."""
import os

import pytest

from recsys_common.serving.model_config import (EnsembleStep, ModelConfigError, TensorSpec, check_model_directory,
                                                config_tensors, model_config_text, parse_model_config)
from serving_tiny_model import tiny_config_text

INPUTS = [TensorSpec("numerical", "float32", [13]), TensorSpec("categorical", "int64", [26])]
OUTPUTS = [TensorSpec("probability", "float32", [1])]


def _write(path, text):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)


def test_config_round_trip_through_the_protobuf(tmp_path):
    text = model_config_text("dlrm-onnx", "onnxruntime_onnx", INPUTS, OUTPUTS, max_batch_size=2048,
                             dynamic_batching_delay_us=100, preferred_batch_sizes=[256, 1024], instance_count=2,
                             parameters={"recipe": "dlrm"})
    _write(str(tmp_path / "config.pbtxt"), text)
    config = parse_model_config(str(tmp_path / "config.pbtxt"))
    assert (config.name, config.platform, config.max_batch_size) == ("dlrm-onnx", "onnxruntime_onnx", 2048)
    assert config.dynamic_batching.max_queue_delay_microseconds == 100
    assert list(config.dynamic_batching.preferred_batch_size) == [256, 1024]
    assert [(g.count, g.kind) for g in config.instance_group] == [(2, 2)]  # 2 = KIND_CPU
    assert config.parameters["recipe"].string_value == "dlrm"
    assert config_tensors(config) == {"inputs": [TensorSpec("numerical", "float32", [13]),
                                                 TensorSpec("categorical", "int64", [26])],
                                      "outputs": [TensorSpec("probability", "float32", [1])]}
    assert 'data_type: TYPE_INT64' in text and "dims: 26" in text


def test_no_dynamic_batching_unless_asked():
    assert "dynamic_batching" not in model_config_text("m", "pytorch_libtorch", INPUTS, OUTPUTS, 16)


@pytest.mark.parametrize("kwargs, message", [
    (dict(platform="tensorrt_plan"), "platform 'tensorrt_plan' is not one of"),
    (dict(max_batch_size=-1), "max_batch_size must be >= 0"),
    (dict(inputs=[TensorSpec("x", "complex64", [1])]), "dtype 'complex64' has no Triton type"),
    (dict(inputs=[TensorSpec("x", "float32", [0])]), "tensor 'x': dims [0]"),
    (dict(preferred_batch_sizes=[4096], dynamic_batching_delay_us=10), "preferred batch size 4096 is not in 1..64"),
    (dict(instance_count=0), "instance_count must be >= 1"),
    (dict(platform="ensemble"), "platform 'ensemble' needs ensemble_steps"),
])
def test_invalid_configs_are_refused(kwargs, message):
    args = dict(name="m", platform="onnxruntime_onnx", inputs=INPUTS, outputs=OUTPUTS, max_batch_size=64)
    args.update(kwargs)
    with pytest.raises(ModelConfigError, match=message.replace("[", r"\[").replace("(", r"\(")):
        model_config_text(**args)


def test_malformed_file_names_the_file_and_the_error(tmp_path):
    path = str(tmp_path / "config.pbtxt")
    _write(path, 'name: "m"\nplatform: "onnxruntime_onnx"\nmax_batch_size: lots\n')
    with pytest.raises(ModelConfigError) as info:
        parse_model_config(path)
    assert path in str(info.value) and "max_batch_size" in str(info.value) and "3:" in str(info.value)
    with pytest.raises(ModelConfigError, match="no such model configuration file"):
        parse_model_config(str(tmp_path / "absent.pbtxt"))


@pytest.mark.parametrize("platform, model_file", [
    ("onnxruntime_onnx", "model.onnx"), ("pytorch_libtorch", "model.pt"),
    ("tensorflow_savedmodel", "model.savedmodel/saved_model.pb")])
def test_check_model_directory_per_platform(tmp_path, platform, model_file):
    model_dir = tmp_path / "m"
    _write(str(model_dir / "config.pbtxt"), model_config_text("m", platform, INPUTS, OUTPUTS, 64))
    os.makedirs(model_dir / "1")
    with pytest.raises(ModelConfigError, match=f"{model_dir}/1/{model_file.split('/')[0]}"):
        check_model_directory(str(model_dir))
    _write(str(model_dir / "1" / model_file), "x")
    assert check_model_directory(str(model_dir)).platform == platform


def test_check_model_directory_errors(tmp_path):
    model_dir = tmp_path / "m"
    _write(str(model_dir / "config.pbtxt"), tiny_config_text("other"))
    with pytest.raises(ModelConfigError, match="name 'other' differs from the directory name 'm'"):
        check_model_directory(str(model_dir))
    _write(str(model_dir / "config.pbtxt"), tiny_config_text("m"))
    with pytest.raises(ModelConfigError, match="no numeric version directory"):
        check_model_directory(str(model_dir))
    _write(str(model_dir / "config.pbtxt"), 'name: "m"\nplatform: "onnxruntime_onnx"\n')
    with pytest.raises(ModelConfigError, match="declares no input"):
        check_model_directory(str(model_dir))


def test_ensemble(tmp_path):
    steps = [EnsembleStep("embeddings", {"categorical": "categorical"}, {"embedded": "emb"}),
             EnsembleStep("dense", {"numerical": "numerical", "embedded": "emb"}, {"probability": "probability"})]
    model_dir = tmp_path / "dlrm-ensemble"
    text = model_config_text("dlrm-ensemble", "ensemble", INPUTS, OUTPUTS, 64, ensemble_steps=steps)
    _write(str(model_dir / "config.pbtxt"), text)
    os.makedirs(model_dir / "1")
    config = check_model_directory(str(model_dir))
    assert [s.model_name for s in config.ensemble_scheduling.step] == ["embeddings", "dense"]
    assert not config.instance_group  # Triton schedules an ensemble itself
    broken = [steps[1], steps[0]]  # the dense step would read "emb" before any step produced it
    _write(str(model_dir / "config.pbtxt"),
           model_config_text("dlrm-ensemble", "ensemble", INPUTS, OUTPUTS, 64, ensemble_steps=broken))
    with pytest.raises(ModelConfigError, match="reads 'emb' for its input 'embedded'"):
        check_model_directory(str(model_dir))
    _write(str(model_dir / "config.pbtxt"), model_config_text(
        "dlrm-ensemble", "ensemble", INPUTS, OUTPUTS, 64, ensemble_steps=steps[:1]))
    with pytest.raises(ModelConfigError, match=r"ensemble outputs \['probability'\] are produced by no step"):
        check_model_directory(str(model_dir))


def test_docstring_examples():
    import doctest
    from recsys_common.serving import model_config
    result = doctest.testmod(model_config)
    assert result.attempted > 0 and result.failed == 0
