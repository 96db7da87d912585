"""The Dockerfile installs the versions the recipe is tested with (ci/constraints.txt) and never falls back silently."""
import os
import re

from conftest import RECIPE_DIR
from recsys_testing import ci_pins, read_dockerfile

DOCKERFILE = os.path.join(RECIPE_DIR, "Dockerfile")


def _docker_args():
    text, args, _ = read_dockerfile(DOCKERFILE)
    return args, text


def test_dockerfile_pins_the_tested_torch_torchrec_and_fbgemm():
    pins = ci_pins()
    args, _ = _docker_args()
    assert args["TORCH_VERSION"] == pins["torch"]
    assert args["TORCHREC_VERSION"] == pins["torchrec"]
    assert args["FBGEMM_VERSION"] == pins["fbgemm-gpu-cpu"]  # CI runs the CPU build of the same FBGEMM release
    assert args["BASE_IMAGE"].startswith(f"pytorch/pytorch:{pins['torch']}-cuda")


def test_dockerfile_fails_loudly_instead_of_falling_back():
    _, text = _docker_args()
    commands = re.findall(r"^RUN (.*?)(?<!\\)\n", text, flags=re.M | re.S)
    install = [c for c in commands if "torchrec==" in c]
    assert len(install) == 1
    assert install[0].lstrip().startswith("set -e")
    assert "||" not in install[0] and "uninstall" not in install[0]  # no silent multi_table-only image
    assert "import torch, fbgemm_gpu, torchrec" in install[0]  # the build imports what it installed
    assert any("TORCH_VERSION" in c and "sys.exit" in c for c in commands)  # and checks the base image's torch
