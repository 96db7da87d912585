#!/usr/bin/env bash
# One command from a fresh Debian machine (Python 3.11, PyPI reachable) to the full CPU
# environment of every recipe in <repo>/.venv:
#
#   bash ci/setup_env.sh          (or: make setup)
#
# What it does, in order:
#   0. ci/system_packages.sh: the Debian/Ubuntu packages the stack needs (Java 17, build-essential, cmake, patch,
#      libb64-0d, python3.11-venv/-dev); apt-get installs the missing ones when root, else it stops with the command;
#   1. creates <repo>/.venv if it is missing (an existing venv is updated in place, additively);
#   2. pip, setuptools, wheel at the pinned versions;
#   3. torch==2.13.0 FIRST (the CPU wheel; any unpinned torch pulls ~3 GB of CUDA);
#   4. ci/requirements.txt, every package pinned exactly by ci/constraints.txt;
#   5. ci/requirements-nodeps.txt with --no-deps (tf-keras, torchrec, fbgemm-gpu-cpu, tensorflow-recommenders);
#   6. removes NVTabular / merlin left in an existing venv by an earlier setup (they have their own environment);
#   (Horovod is not built here: ci/setup_horovod.sh, make setup-horovod, about 8 minutes on 2 cores the first
#    time; only multi-process TensorFlow runs (horovodrun) and their tests need it, so make quickstart does not wait.)
#   7. pip install -e common (the shared library recsys_common) and the four recipes (editable, --no-deps: the
#      packages dlrm, ncf's modules, dlrm_dcnv2, wide_deep import from anywhere; NVIDIA's python dlrm.py / main.py /
#      ncf.py keep working from each recipe directory without it);
#   7b. Triton's perf_analyzer into <venv>/opt/perf_analyzer (ci/install_perf_analyzer.sh: the binary from the
#      tritonclient 2.35.0 wheel, libcudart from nvidia-cuda-runtime-cu12; libb64-0d comes from step 0);
#   7c. a real Triton server (2.51, Python backend) into <venv>/opt/tritonserver (ci/install_tritonserver.sh: the
#      tritonserver binary of the nvidia-pytriton 0.7.0 wheel, and a numpy 1.26 environment for its Python stub);
#      recsys_common.serving.triton_server starts it;
#   8. an import check of the whole stack, then a stamp file.
# NVTabular is not in this environment: ci/setup_nvtabular_env.sh (make setup-nvtabular) builds its own.
#
# A second run is a no-op while the stamp (a hash of this script, the constraints, the
# requirement lists and the pyproject.toml files) matches. RECSYS_SETUP_FORCE=1 redoes it.
#
# Environment knobs:
#   PYTHON              interpreter used to create the venv (default: python3.11, else python3 if it is 3.11)
#   RECSYS_SKIP_SYSTEM_PACKAGES  1 = only warn about missing system packages (non-Debian machines, no sudo)
#   RECSYS_VENV         venv location (default: <repo>/.venv)
#   RECSYS_SETUP_FORCE  1 = ignore the stamp
#   RECSYS_PIP_ARGS     extra arguments for every pip install (e.g. an --extra-index-url that has a
#                       torch 2.13.0 CPU wheel, on a machine where PyPI's default torch is the CUDA build)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RECSYS_VENV:-$REPO/.venv}"
CONSTRAINTS="$REPO/ci/constraints.txt"
REQS="$REPO/ci/requirements.txt"
REQS_NODEPS="$REPO/ci/requirements-nodeps.txt"
# The editable installs of step 7: the shared library, then each recipe (its pyproject.toml names its packages).
PROJECTS=(common PyTorch/DLRM PyTorch/NCF TensorFlow2/DLRM_DCNv2 TensorFlow2/WideAndDeep)
PYPROJECTS=()
for project in "${PROJECTS[@]}"; do PYPROJECTS+=("$REPO/$project/pyproject.toml"); done
STAMP="$VENV/.recsys-setup-stamp"
read -r -a EXTRA_PIP_ARGS <<< "${RECSYS_PIP_ARGS:-}"

T0=$SECONDS
step() { printf '[setup %4ss] %s\n' "$((SECONDS - T0))" "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

for f in "$CONSTRAINTS" "$REQS" "$REQS_NODEPS" "${PYPROJECTS[@]}"; do
  [[ -f "$f" ]] || die "missing $f (run this script from a full checkout)"
done

stamp_hash() {
  cat "${BASH_SOURCE[0]}" "$CONSTRAINTS" "$REQS" "$REQS_NODEPS" "${PYPROJECTS[@]}" \
      "$REPO/ci/install_perf_analyzer.sh" "$REPO/ci/install_tritonserver.sh" \
    | sha256sum | cut -d' ' -f1
}
WANT_STAMP="$(stamp_hash)"

if [[ "${RECSYS_SETUP_FORCE:-0}" != 1 && -x "$VENV/bin/python" && -f "$STAMP" \
      && "$(cat "$STAMP")" == "$WANT_STAMP" ]]; then
  step "environment $VENV is up to date (stamp matches; RECSYS_SETUP_FORCE=1 to redo)"
  exit 0
fi

# --- 0. system packages: Java 17, build-essential, cmake, patch, libb64-0d, python3.11-venv/-dev --------
# ci/system_packages.sh decides (the one place that does): apt-get installs what is missing when root,
# otherwise it stops here with the one command to run. Nothing is missing: it only says so.
if [[ -x "$VENV/bin/python" ]]; then
  bash "$REPO/ci/system_packages.sh" --python "$VENV/bin/python" || die "system packages missing (see above)"
else
  bash "$REPO/ci/system_packages.sh" || die "system packages missing (see above)"
fi

# --- 1. the virtual environment ---------------------------------------------------------
if [[ ! -x "$VENV/bin/python" ]]; then
  if [[ -z "${PYTHON:-}" ]]; then
    if command -v python3.11 >/dev/null 2>&1; then PYTHON=python3.11
    elif command -v python3 >/dev/null 2>&1 \
         && [[ "$(python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')" == 3.11 ]]; then PYTHON=python3
    else die "Python 3.11 not found: install it or set PYTHON=/path/to/python3.11"
    fi
  fi
  step "creating $VENV with $PYTHON ($("$PYTHON" --version 2>&1))"
  "$PYTHON" -m venv "$VENV"
else
  step "updating existing $VENV (additive: nothing is removed)"
fi
PY="$VENV/bin/python"
[[ "$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" == 3.11 ]] \
  || die "$VENV is not a Python 3.11 environment; remove it or set RECSYS_VENV"

# This machine's pip config names local file indexes that lack most packages: drop pip's
# "Location ... is ignored" noise (pip's own exit status still decides, through pipefail).
pip_install() {
  "$PY" -m pip install --progress-bar off -q -c "$CONSTRAINTS" "${EXTRA_PIP_ARGS[@]}" "$@" 2>&1 \
    | { grep -v "^WARNING: Location 'file:" || true; }
}

# --- 2-5. packages ------------------------------------------------------------------------
step "pip, setuptools, wheel"
pip_install pip setuptools wheel
step "torch==2.13.0 (CPU build) first"
pip_install torch==2.13.0
"$PY" -c 'import torch, sys; v = torch.__version__; sys.exit(0 if v.startswith("2.13.0") and torch.version.cuda is None else "torch %s (cuda %s) is not the 2.13.0 CPU build" % (v, torch.version.cuda))'
step "the stack from ci/requirements.txt, pinned by ci/constraints.txt (3-4 minutes on a fresh machine)"
pip_install -r "$REQS"
step "tf-keras, torchrec, fbgemm-gpu-cpu with --no-deps"
pip_install --no-deps -r "$REQS_NODEPS"

# --- 6. NVTabular out ---------------------------------------------------------------------------
# A venv made by an earlier setup held NVTabular / merlin and their 2023 pins; they moved to their own environment
# (ci/setup_nvtabular_env.sh) and would not import beside numpy 2 here: remove them from this one.
OLD=()
for name in nvtabular merlin-core merlin-dataloader dask-cuda; do
  "$PY" -m pip show -q "$name" >/dev/null 2>&1 && OLD+=("$name")
done
if (( ${#OLD[@]} )); then
  step "removing ${OLD[*]} from $VENV (NVTabular has its own environment now: make setup-nvtabular)"
  "$PY" -m pip uninstall -q -y "${OLD[@]}"
fi

# --- 7. the shared library --------------------------------------------------------------------
step "pip install -e common and the recipes (${PROJECTS[*]})"
EDITABLE=()
for project in "${PROJECTS[@]}"; do EDITABLE+=(-e "$REPO/$project"); done
pip_install --no-deps --no-build-isolation "${EDITABLE[@]}"

# --- 7b. perf_analyzer (never fails the setup; it says what is missing) ------------------------
step "Triton perf_analyzer (tritonclient 2.35.0 wheel) into $VENV/opt/perf_analyzer"
bash "$REPO/ci/install_perf_analyzer.sh" "$PY"

# --- 7c. tritonserver (never fails the setup; it says what is missing) ---------------------------------
step "Triton Inference Server (nvidia-pytriton 0.7.0 wheel) into $VENV/opt/tritonserver"
bash "$REPO/ci/install_tritonserver.sh" "$PY"

# --- 8. check -------------------------------------------------------------------------------
step "checking the stack imports with the pinned versions"
TF_USE_LEGACY_KERAS=1 TF_CPP_MIN_LOG_LEVEL=2 "$PY" - "$CONSTRAINTS" <<'PYEOF'
import sys
from importlib import metadata
pins = {}
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if "==" in line:
        name, version = line.split("==", 1)
        pins[name.split("[")[0].strip().lower().replace("_", "-")] = version.strip()
bad = []
for name in ("numpy", "pandas", "pyarrow", "torch", "tensorflow-cpu", "tf-keras",
             "dask", "distributed", "pyspark", "torchrec", "fbgemm-gpu-cpu", "onnx", "onnxruntime",
             "tritonclient", "pip"):
    got = metadata.version(name).split("+")[0]
    if pins.get(name) is not None and got != pins[name].split("+")[0]:
        bad.append(f"{name}: installed {got}, constraints.txt says {pins[name]}")
if bad:
    sys.exit("version drift:\n  " + "\n  ".join(bad))
import numpy, pandas, pyarrow, torch, tensorflow, tf_keras, pyspark  # noqa: E401,F401
import torchrec, fbgemm_gpu, onnx, onnxruntime, onnxscript, tf2onnx, tritonclient.grpc, tritonclient.http  # noqa
import recsys_common  # noqa
import dlrm, dlrm_dcnv2, wide_deep, neumf  # noqa: E401,F401  (the recipes, installed editable)
print(f"[setup] ok: torch {torch.__version__}, tensorflow {tensorflow.__version__}, numpy {numpy.__version__}, "
      f"pandas {pandas.__version__}, pyarrow {pyarrow.__version__}")
PYEOF
echo "$WANT_STAMP" > "$STAMP"
step "done: $VENV ready (use $VENV/bin/python; TF code needs TF_USE_LEGACY_KERAS=1)"
