"""Dockerfile and requirements.txt, checked statically (no Docker engine runs here): the image keeps its own
TensorFlow and Horovod, installs what the tests pin, copies paths that exist, and never falls back silently."""
import os
import re
import subprocess

from conftest import RECIPE_DIR, REPO_ROOT
from recsys_testing import ci_pins, read_dockerfile, requirement_specs

DOCKERFILE = os.path.join(RECIPE_DIR, "Dockerfile")
REQUIREMENTS = os.path.join(RECIPE_DIR, "requirements.txt")


def test_requirements_never_replace_the_images_tensorflow_or_horovod():
    reqs = requirement_specs(REQUIREMENTS)
    assert not {"tensorflow", "tensorflow-cpu", "horovod", "tf-keras", "keras", "torch"} & set(reqs), reqs
    pins = ci_pins()
    for name, spec in reqs.items():   # an exact pin here is the version CI tests
        if spec.startswith("=="):
            assert spec[2:] == pins[name], f"{name}{spec} but ci/constraints.txt has {pins.get(name)}"
    assert reqs["pyspark"] == "==" + pins["pyspark"]


def test_dockerfile_base_is_an_ngc_tensorflow_image_and_is_checked():
    _, args, runs = read_dockerfile(DOCKERFILE)
    assert re.fullmatch(r"nvcr\.io/nvidia/tensorflow:\d\d\.\d\d-tf2-py3", args["BASE_IMAGE"]), args["BASE_IMAGE"]
    check = [r for r in runs if "is_built_with_cuda" in r]
    assert len(check) == 1 and "import sys, tensorflow as tf, horovod.tensorflow" in check[0]


def test_dockerfile_installs_tf_keras_for_the_images_tensorflow_without_dependencies():
    _, _, runs = read_dockerfile(DOCKERFILE)
    keras = [r for r in runs if "tf-keras" in r]
    assert len(keras) == 1 and keras[0].lstrip().startswith("set -e")
    assert "--no-deps" in keras[0] and '"tf-keras~=${TF_MINOR}.0"' in keras[0]
    assert "tf_keras" in keras[0]    # and checks that tf.keras is then Keras 2


def test_dockerfile_mde_build_is_optional_but_never_silent():
    _, args, runs = read_dockerfile(DOCKERFILE)
    assert args["WITH_MDE"] == "0"
    mde = [r for r in runs if "distributed-embeddings" in r]
    assert len(mde) == 1 and mde[0].lstrip().startswith("set -e")
    assert "||" not in mde[0] and "make pip_pkg" in mde[0]
    assert "import distributed_embeddings.python.layers.dist_model_parallel" in mde[0]
    # the module the recipe imports is the one the build checks
    sparse = open(os.path.join(RECIPE_DIR, "dlrm_dcnv2", "model", "sparse_model.py")).read()
    assert "distributed_embeddings.python.layers.dist_model_parallel" in sparse


def test_dockerfile_copies_existing_paths_from_the_repository_root():
    text, _, _ = read_dockerfile(DOCKERFILE)
    sources = re.findall(r"^COPY (\S+) ", text, flags=re.M)
    assert "common/" in sources and "TensorFlow2/DLRM_DCNv2/" in sources
    for source in sources:
        assert os.path.exists(os.path.join(REPO_ROOT, source)), source


def test_docker_build_dry_run_uses_the_repository_root():
    out = subprocess.run(["bash", "docker/build.sh", "--dry-run", "TensorFlow2/DLRM_DCNv2"], cwd=REPO_ROOT,
                         check=True, capture_output=True, text=True).stdout
    assert "-f TensorFlow2/DLRM_DCNv2/Dockerfile" in out and "-t recsys/tensorflow2-dlrm-dcnv2:latest" in out
