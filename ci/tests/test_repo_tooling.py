"""The environment matches ci/constraints.txt, and the repo's shell tooling parses and dry-runs."""
import re
import subprocess
from importlib import metadata

import pytest

from launch_utils import REPO

CRITICAL = {  # the pins that everything else depends on (constraints.txt's header says why any is behind)
    "pip": "26.3", "torch": "2.13.0", "numpy": "2.4.6", "pandas": "3.1.1", "pyarrow": "26.0.1",
    "tensorflow-cpu": "2.21.0", "tf-keras": "2.21.0", "dask": "2026.8.0", "distributed": "2026.8.0",
    "pyspark": "4.3.0", "polars": "2.1.0", "torchrec": "1.8.0", "fbgemm-gpu-cpu": "1.8.0", "horovod": "0.28.1",
    "onnx": "1.23.2", "onnxruntime": "1.32.0", "onnxscript": "0.7.2", "tf2onnx": "1.17.0", "tritonclient": "2.73.0",
}
# Never in the default environment: NVTabular and merlin (abandoned in 2023; they hold numpy 1.26 / pandas 1.5 /
# pyarrow 12) live in ci/nvtabular-env/. And no release with a known critical advisory on the files users feed us:
# pyarrow before 14.0.1 runs code from a crafted Parquet / Arrow IPC file (CVE-2023-47248, GHSA-5wvp-7f3h-6wmm).
ABSENT = ("nvtabular", "merlin-core", "merlin-dataloader", "dask-cuda")


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def constraints():
    pins = {}
    for raw in (REPO / "ci" / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        assert re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!_-]+", line), f"not an exact pin: {raw!r}"
        name, version = line.split("==")
        assert norm(name) not in pins, f"{name} pinned twice"
        pins[norm(name)] = version
    return pins


def test_constraints_pin_the_whole_stack_exactly():
    pins = constraints()
    for name, version in CRITICAL.items():
        assert pins.get(name) == version, f"constraints.txt pins {name}=={pins.get(name)}, expected {version}"
    assert "recsys-common" not in pins


def test_no_abandoned_or_vulnerable_package_in_the_default_environment():
    pins = constraints()
    installed = {norm(d.metadata["Name"]) for d in metadata.distributions()}
    for name in ABSENT:
        assert name not in pins, f"constraints.txt pins {name}: it belongs in ci/nvtabular-env/"
        assert name not in installed, f"{name} is installed in the default environment (make setup removes it)"
    pyarrow = tuple(int(p) for p in pins["pyarrow"].split(".")[:3])
    assert pyarrow >= (14, 0, 1), f"pyarrow {pins['pyarrow']} is affected by CVE-2023-47248"


def test_nvtabular_environment_pins_exactly_and_patches_pyarrow():
    """The separate NVTabular environment keeps the 2023 pins NVTabular needs, exactly, and pyarrow-hotfix for its
    pyarrow 12 (CVE-2023-47248), which its engines import before reading."""
    pins = {}
    for raw in (REPO / "ci" / "nvtabular-env" / "constraints.txt").read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            assert re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.+!_-]+", line), f"not an exact pin: {raw!r}"
            name, version = line.split("==")
            pins[norm(name)] = version
    assert pins["nvtabular"] == "23.8.0" and pins["pandas"] == "1.5.3" and pins["numpy"] == "1.26.4"
    assert "pyarrow-hotfix" in pins
    assert not {"tensorflow", "tensorflow-cpu", "torch"} & set(pins), "the NVTabular environment holds only the ETL"


def test_installed_versions_match_constraints():
    """No package silently upgraded or downgraded."""
    pins = constraints()
    installed = {norm(d.metadata["Name"]): d.version for d in metadata.distributions()}
    missing = [n for n in CRITICAL if n not in installed]
    assert not missing, f"not installed: {missing} (run make setup)"
    drift = {n: (installed[n], v) for n, v in pins.items()
             if n in installed and installed[n].split("+")[0] != v.split("+")[0]}
    assert not drift, f"installed != constraints.txt: {drift}"


def test_torch_is_the_cpu_build():
    import torch
    assert torch.__version__.split("+")[0] == "2.13.0"
    assert torch.version.cuda is None


@pytest.mark.parametrize("script", ["ci/setup_env.sh", "ci/setup_horovod.sh", "ci/setup_nvtabular_env.sh",
                                    "ci/run_tests.sh", ".ci/run", "docker/build.sh"])
def test_shell_scripts_parse(script):
    subprocess.run(["bash", "-n", str(REPO / script)], check=True)


def test_docker_build_dry_run(tmp_path):
    models = sorted(p.parent.relative_to(REPO) for p in REPO.glob("*/*/Dockerfile"))
    for model in models:
        out = subprocess.run(["bash", "docker/build.sh", "--dry-run", str(model)], cwd=REPO, check=True,
                             capture_output=True, text=True).stdout
        tag = "recsys/" + str(model).lower().replace("/", "-").replace("_", "-") + ":latest"
        assert f"-f {model}/Dockerfile" in out and f"-t {tag}" in out and "--exclude=./.venv" in out, out
    bad = subprocess.run(["bash", "docker/build.sh", "--dry-run", "NoSuch/Model"], cwd=REPO,
                         capture_output=True, text=True)
    assert bad.returncode != 0 and "NoSuch/Model" in bad.stderr
    outside = subprocess.run(["bash", "docker/build.sh", "--dry-run", "../etc"], cwd=REPO,
                             capture_output=True, text=True)
    assert outside.returncode == 2 and "relative to the repository root" in outside.stderr


def test_makefile_targets_use_the_venv_python():
    out = subprocess.run(["make", "-n", "test", "quickstart"], cwd=REPO, check=True, capture_output=True,
                         text=True).stdout
    assert "bash ci/setup_env.sh" in out and "bash ci/run_tests.sh" in out
    # No bare "python": every Python command runs the venv's interpreter explicitly.
    assert not re.search(r"(^|[\s;&|])python3?(\s|$)", out, re.M), out


def test_run_tests_reports_failures(tmp_path):
    """ci/run_tests.sh exits non-zero when a component has no tests/ (asked for explicitly)."""
    proc = subprocess.run(["bash", "ci/run_tests.sh", "docker"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode != 0
    assert "docker" in proc.stdout and "FAILED (no tests/)" in proc.stdout
