"""Dockerfile and requirements.txt, checked statically (no Docker engine runs here): the image keeps its own
TensorFlow, Horovod and Merlin packages, checks them, and copies paths that exist."""
import os
import re

from conftest import RECIPE_DIR, REPO_ROOT
from recsys_testing import ci_pins, read_dockerfile, requirement_specs

DOCKERFILE = os.path.join(RECIPE_DIR, "Dockerfile")


def test_requirements_keep_the_images_framework_packages_and_agree_with_ci():
    reqs = requirement_specs(os.path.join(RECIPE_DIR, "requirements.txt"))
    image_owned = {"tensorflow", "tensorflow-cpu", "tf-keras", "keras", "horovod", "nvtabular", "merlin-core",
                   "merlin-dataloader", "dask", "distributed", "dask-cuda", "cudf", "torch"}
    assert not image_owned & set(reqs), image_owned & set(reqs)
    pins = ci_pins()
    for name, spec in reqs.items():
        if spec.startswith("=="):
            assert spec[2:] == pins[name], f"{name}{spec} but ci/constraints.txt has {pins.get(name)}"
        m = re.match(r">=\s*([\d.]+)$", spec)
        if m and name in pins:   # a lower bound CI itself satisfies
            ci = tuple(int(x) for x in re.findall(r"\d+", pins[name])[:3])
            assert ci >= tuple(int(x) for x in m.group(1).split(".")), f"{name}{spec} vs CI {pins[name]}"
    # what the CI environment installs for this recipe is pinned there; NVTabular only in its own environment
    for name in ("pyarrow", "pandas", "scipy", "pyyaml", "polars"):
        assert name in pins, name
    assert "nvtabular" not in pins and "nvtabular" in ci_pins("ci/nvtabular-env/constraints.txt")
    # the image's pyarrow may predate CVE-2023-47248's fix: recsys_common then needs pyarrow-hotfix
    assert "pyarrow-hotfix" in reqs


def test_dockerfile_base_is_an_ngc_merlin_tensorflow_image_matching_ci_nvtabular():
    _, args, runs = read_dockerfile(DOCKERFILE)
    m = re.fullmatch(r"nvcr\.io/nvidia/merlin/merlin-tensorflow:(\d\d)\.(\d\d)", args["BASE_IMAGE"])
    assert m, args["BASE_IMAGE"]
    nvtabular = ci_pins("ci/nvtabular-env/constraints.txt")["nvtabular"]   # the --engine nvtabular tests' version
    assert f"{int(m.group(1))}.{int(m.group(2))}.0" == nvtabular   # 23.08 <-> nvtabular 23.8.0
    check = [r for r in runs if "is_built_with_cuda" in r]
    assert len(check) == 1
    for module in ("horovod.tensorflow", "nvtabular"):
        assert module in check[0]


def test_dockerfile_installs_keras_2_without_replacing_tensorflow():
    _, _, runs = read_dockerfile(DOCKERFILE)
    keras = [r for r in runs if "tf-keras" in r]
    assert len(keras) == 1 and keras[0].lstrip().startswith("set -e") and "||" not in keras[0]
    assert "--no-deps" in keras[0] and '"tf-keras~=${TF_MINOR}.0"' in keras[0]
    reqs = [r for r in runs if "requirements.txt" in r]
    assert len(reqs) == 1 and "--upgrade" not in reqs[0] and "-U " not in reqs[0]


def test_dockerfile_copies_existing_paths_from_the_repository_root():
    text, _, _ = read_dockerfile(DOCKERFILE)
    sources = re.findall(r"^COPY (\S+) ", text, flags=re.M)
    assert sources == ["common/", "TensorFlow2/WideAndDeep/requirements.txt", "TensorFlow2/WideAndDeep/"]
    for src in sources:
        assert os.path.exists(os.path.join(REPO_ROOT, src)), src


def test_recipe_tools_named_in_the_dockerfile_exist():
    text, _, _ = read_dockerfile(DOCKERFILE)
    for path in ("scripts/preproc.sh", "hvd_wrapper.sh", "main.py", "quickstart.sh"):
        assert path in text, path
        assert os.path.exists(os.path.join(RECIPE_DIR, path)), path
