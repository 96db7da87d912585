"""ci/system_packages.sh: which missing command or library asks for which Debian package, root or not.

Runs the script against a directory of stub executables (RECSYS_SYSPKG_PATH) and a fake user id
(RECSYS_SYSPKG_UID), so it needs neither root nor network and never touches this machine's packages.
"""
import os
import subprocess

import pytest

from launch_utils import REPO

SCRIPT = REPO / "ci" / "system_packages.sh"
JAVA17 = 'openjdk version "17.0.15" 2025-04-15'
STUBS = {  # name -> what it prints; every one of them present means nothing is missing
    "java": f"echo '{JAVA17}' >&2",
    "gcc": "", "g++": "", "make": "", "cmake": "", "patch": "",
    "ldconfig": r"printf '\tlibb64.so.0d (libc6,x86-64) => /lib/x86_64-linux-gnu/libb64.so.0d\n'",
    "python3.11": "echo '3.11 1 1'",  # version, ensurepip importable, Python.h present
    "apt-get": 'echo "$@" >> "$(dirname "$0")/apt-get.calls"',
}


def run(tmp_path, uid=0, args=("--print",), drop=(), extra_env=None, **override):
    """The script with the stubs minus `drop`, stub bodies replaced by `override`; returns the process."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in {**STUBS, **override}.items():
        if name not in drop:
            (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
            (bin_dir / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k not in ("JAVA_HOME", "PYTHON", "RECSYS_SKIP_SYSTEM_PACKAGES")}
    env.update(RECSYS_SYSPKG_PATH=str(bin_dir), RECSYS_SYSPKG_UID=str(uid), **(extra_env or {}))
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


def apt_calls(tmp_path):
    calls = tmp_path / "bin" / "apt-get.calls"
    return calls.read_text().splitlines() if calls.exists() else []


def would_install(proc):
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stdout.splitlines() if "would run: apt-get install" in line]
    if not lines:
        assert "nothing to install" in proc.stdout, proc.stdout
        return []
    (line,) = lines
    assert line.split("would run: ")[1].startswith("apt-get install -y --no-install-recommends "), line
    return line.split("--no-install-recommends ")[1].split()


@pytest.mark.parametrize("uid", [0, 1000])
def test_nothing_missing_installs_nothing(tmp_path, uid):
    proc = run(tmp_path, uid=uid)
    assert proc.returncode == 0 and "nothing to install (java 17.0.15," in proc.stdout, proc.stdout + proc.stderr
    assert apt_calls(tmp_path) == []


@pytest.mark.parametrize("java, expected", [
    (None, ["openjdk-17-jre-headless"]),
    ('openjdk version "11.0.21" 2023-10-17', ["openjdk-17-jre-headless"]),
    ('java version "1.8.0_392"', ["openjdk-17-jre-headless"]),
    ('openjdk version "21.0.5" 2024-10-15', []),
    ('openjdk version "17" 2021-09-14', []),
])
def test_java_older_than_17_or_missing_asks_for_openjdk_17(tmp_path, java, expected):
    if java is None:
        proc = run(tmp_path, drop=("java",))
    else:
        proc = run(tmp_path, java=f"echo '{java}' >&2")
    assert would_install(proc) == expected


@pytest.mark.parametrize("drop, expected", [
    (("cmake",), ["cmake"]),
    (("gcc", "g++"), ["build-essential"]),  # one package for both
    (("make",), ["build-essential"]),
    (("patch",), ["patch"]),
    (("python3.11",), ["python3.11", "python3.11-venv", "python3.11-dev"]),
    (("java", "cmake", "g++"), ["openjdk-17-jre-headless", "build-essential", "cmake"]),
])
def test_missing_commands_map_to_packages(tmp_path, drop, expected):
    assert would_install(run(tmp_path, drop=drop)) == expected


@pytest.mark.parametrize("override, expected", [
    ({"ldconfig": "echo '42 libs found in cache'"}, ["libb64-0d"]),
    ({"python3.11": "echo '3.11 0 1'"}, ["python3.11-venv"]),
    ({"python3.11": "echo '3.11 1 0'"}, ["python3.11-dev"]),
])
def test_missing_library_venv_or_headers(tmp_path, override, expected):
    assert would_install(run(tmp_path, **override)) == expected


def test_not_root_stops_with_the_one_command(tmp_path):
    proc = run(tmp_path, uid=1000, args=(), drop=("java", "cmake"))
    assert proc.returncode == 1
    commands = [line.strip() for line in proc.stderr.splitlines() if line.startswith("  sudo ")]
    assert commands == ["sudo apt-get install -y --no-install-recommends openjdk-17-jre-headless cmake"], proc.stderr
    assert "no java" in proc.stdout and "no cmake" in proc.stdout
    assert apt_calls(tmp_path) == []


def test_root_runs_apt_update_once_then_install(tmp_path):
    """Not a dry run: the stub apt-get (found only through RECSYS_SYSPKG_PATH) records its calls."""
    proc = run(tmp_path, uid=0, args=(), drop=("cmake",), ldconfig="true")
    assert proc.returncode == 0, proc.stderr
    assert apt_calls(tmp_path) == ["update -q", "install -y --no-install-recommends cmake libb64-0d"]


def test_no_apt_get_stops_naming_the_packages(tmp_path):
    proc = run(tmp_path, args=(), drop=("apt-get", "cmake"))
    assert proc.returncode == 1 and "no apt-get" in proc.stderr and "cmake" in proc.stderr


def test_skip_knob_warns_and_goes_on(tmp_path):
    assert run(tmp_path, uid=1000, args=(), drop=("cmake",)).returncode == 1
    proc = run(tmp_path, uid=1000, args=(), drop=("cmake",), extra_env={"RECSYS_SKIP_SYSTEM_PACKAGES": "1"})
    assert proc.returncode == 0 and "WARNING" in proc.stdout and "cmake" in proc.stdout
    assert apt_calls(tmp_path) == []


@pytest.mark.skipif(os.environ.get("RECSYS_SKIP_SYSTEM_PACKAGES") == "1", reason="setup told to skip system packages")
def test_this_machine_needs_nothing():
    """make setup ran the script before these tests, so the real machine must have everything (and no apt runs)."""
    proc = subprocess.run(["bash", str(SCRIPT), "--print"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "nothing to install" in proc.stdout, proc.stdout + proc.stderr


def test_setup_env_decides_system_packages_before_the_venv():
    text = (REPO / "ci" / "setup_env.sh").read_text()
    assert text.index('bash "$REPO/ci/system_packages.sh"') < text.index('-m venv "$VENV"')
    assert "apt-get" not in (REPO / "ci" / "install_perf_analyzer.sh").read_text()  # one place decides packages
