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
#   2. pip==26.2.1 (pip 26.3 refuses merlin-dataloader's direct-URL dependency);
#   3. torch==2.13.0 FIRST (the CPU wheel; any unpinned torch pulls ~3 GB of CUDA);
#   4. ci/requirements.txt, every package pinned exactly by ci/constraints.txt;
#   5. ci/requirements-nodeps.txt with --no-deps (tf-keras, torchrec, fbgemm-gpu-cpu, tensorflow-recommenders);
#   6. Horovod 0.28.1 from its PyPI sdist with ci/horovod-0.28.1-tf2.21-torch2.13.patch, gloo,
#      TensorFlow + PyTorch; the built wheel is cached in $RECSYS_WHEEL_CACHE
#      (default ~/.cache/recsys-recipes/wheels), so only the first setup compiles (~8 min on 2 cores);
#   7. pip install -e common (the shared library recsys_common) and the four recipes (editable, --no-deps: the
#      packages dlrm, ncf's modules, dlrm_dcnv2, wide_deep import from anywhere; NVIDIA's python dlrm.py / main.py /
#      ncf.py keep working from each recipe directory without it);
#   7b. Triton's perf_analyzer into <venv>/opt/perf_analyzer (ci/install_perf_analyzer.sh: the binary from the
#      tritonclient 2.35.0 wheel, libcudart from nvidia-cuda-runtime-cu12; libb64-0d comes from step 0);
#   8. an import check of the whole stack, then a stamp file.
#
# A second run is a no-op while the stamp (a hash of this script, the constraints, the
# requirement lists, the patch and the pyproject.toml files) matches. RECSYS_SETUP_FORCE=1 redoes it.
#
# Environment knobs:
#   PYTHON              interpreter used to create the venv (default: python3.11, else python3 if it is 3.11)
#   RECSYS_SKIP_SYSTEM_PACKAGES  1 = only warn about missing system packages (non-Debian machines, no sudo)
#   RECSYS_VENV         venv location (default: <repo>/.venv)
#   RECSYS_WHEEL_CACHE  Horovod wheel cache (default: $HOME/.cache/recsys-recipes/wheels)
#   RECSYS_SETUP_FORCE  1 = ignore the stamp
#   RECSYS_PIP_ARGS     extra arguments for every pip install (e.g. an --extra-index-url that has a
#                       torch 2.13.0 CPU wheel, on a machine where PyPI's default torch is the CUDA build)
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RECSYS_VENV:-$REPO/.venv}"
WHEEL_CACHE="${RECSYS_WHEEL_CACHE:-$HOME/.cache/recsys-recipes/wheels}"
CONSTRAINTS="$REPO/ci/constraints.txt"
REQS="$REPO/ci/requirements.txt"
REQS_NODEPS="$REPO/ci/requirements-nodeps.txt"
PATCH="$REPO/ci/horovod-0.28.1-tf2.21-torch2.13.patch"
# The editable installs of step 7: the shared library, then each recipe (its pyproject.toml names its packages).
PROJECTS=(common PyTorch/DLRM PyTorch/NCF TensorFlow2/DLRM_DCNv2 TensorFlow2/WideAndDeep)
PYPROJECTS=()
for project in "${PROJECTS[@]}"; do PYPROJECTS+=("$REPO/$project/pyproject.toml"); done
HOROVOD_VERSION="0.28.1"
STAMP="$VENV/.recsys-setup-stamp"
read -r -a EXTRA_PIP_ARGS <<< "${RECSYS_PIP_ARGS:-}"

T0=$SECONDS
step() { printf '[setup %4ss] %s\n' "$((SECONDS - T0))" "$*"; }
die() { printf '[setup] ERROR: %s\n' "$*" >&2; exit 1; }

for f in "$CONSTRAINTS" "$REQS" "$REQS_NODEPS" "$PATCH" "${PYPROJECTS[@]}"; do
  [[ -f "$f" ]] || die "missing $f (run this script from a full checkout)"
done

stamp_hash() {
  cat "${BASH_SOURCE[0]}" "$CONSTRAINTS" "$REQS" "$REQS_NODEPS" "$PATCH" "${PYPROJECTS[@]}" \
      "$REPO/ci/install_perf_analyzer.sh" \
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
step "pip==26.2.1, setuptools, wheel"
pip_install pip==26.2.1 setuptools wheel
step "torch==2.13.0 (CPU build) first"
pip_install torch==2.13.0
"$PY" -c 'import torch, sys; v = torch.__version__; sys.exit(0 if v.startswith("2.13.0") and torch.version.cuda is None else "torch %s (cuda %s) is not the 2.13.0 CPU build" % (v, torch.version.cuda))'
step "the stack from ci/requirements.txt, pinned by ci/constraints.txt (3-4 minutes on a fresh machine)"
pip_install -r "$REQS"
step "tf-keras, torchrec, fbgemm-gpu-cpu with --no-deps"
pip_install --no-deps -r "$REQS_NODEPS"

# --- 6. Horovod -----------------------------------------------------------------------------
horovod_ok() {
  "$PY" - <<'PYEOF' >/dev/null 2>&1
import os
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import horovod
assert horovod.__version__ == "0.28.1", horovod.__version__
import horovod.tensorflow as hvd_tf
import horovod.torch as hvd_torch
assert hvd_tf.gloo_built() and hvd_torch.gloo_built()
PYEOF
}
VERSIONS="$("$PY" -c 'import sys, tensorflow as tf, torch; print("py%d%d-tf%s-torch%s" % (sys.version_info[0], sys.version_info[1], tf.__version__, torch.__version__))' 2>/dev/null)"
HVD_KEY="$( (sha256sum < "$PATCH"; echo "$VERSIONS"; uname -m) | sha256sum | cut -c1-16)"
HVD_DIR="$WHEEL_CACHE/horovod-$HOROVOD_VERSION-$HVD_KEY"
if horovod_ok; then
  step "horovod $HOROVOD_VERSION already installed and working"
else
  if ! ls "$HVD_DIR"/horovod-*.whl >/dev/null 2>&1; then
    step "building horovod $HOROVOD_VERSION ($VERSIONS); about 8 minutes on 2 cores; cache: $HVD_DIR"
    BUILD_DIR="$(mktemp -d "${TMPDIR:-/tmp}/horovod-build.XXXXXX")"
    BUILD_LOG="$BUILD_DIR/build.log"
    (
      cd "$BUILD_DIR"
      "$PY" -m pip download -q --no-binary :all: --no-deps "horovod==$HOROVOD_VERSION" -d sdist
      tar xzf "sdist/horovod-$HOROVOD_VERSION.tar.gz"
      cd "horovod-$HOROVOD_VERSION"
      patch -p1 < "$PATCH"
      TF_INC="$("$PY" -c 'import tensorflow as tf; print(tf.sysconfig.get_include())' 2>/dev/null)"
      export CPLUS_INCLUDE_PATH="$TF_INC/external/highwayhash:$TF_INC/external/farmhash_archive/src${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
      export HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITHOUT_MXNET=1 \
             HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_PYTORCH=1
      export MAKEFLAGS="-j$(nproc)"
      "$PY" -m pip wheel -v --no-build-isolation --no-deps . -w "$BUILD_DIR/wheel"
    ) > "$BUILD_LOG" 2>&1 || { tail -n 60 "$BUILD_LOG" >&2; die "horovod build failed; full log: $BUILD_LOG"; }
    mkdir -p "$WHEEL_CACHE"
    TMP_DIR="$(mktemp -d "$WHEEL_CACHE/.tmp.XXXXXX")" && chmod 755 "$TMP_DIR"
    mv "$BUILD_DIR"/wheel/horovod-*.whl "$TMP_DIR"/
    mv -T "$TMP_DIR" "$HVD_DIR" 2>/dev/null || rm -rf "$TMP_DIR"   # another setup may have won the race
    rm -rf "$BUILD_DIR"
    step "horovod wheel cached: $(ls "$HVD_DIR"/horovod-*.whl)"
  else
    step "horovod wheel from cache: $(ls "$HVD_DIR"/horovod-*.whl)"
  fi
  pip_install --no-deps --force-reinstall "$(ls "$HVD_DIR"/horovod-*.whl | head -n1)"
  horovod_ok || die "horovod installed but horovod.tensorflow / horovod.torch do not load"
fi

# --- 7. the shared library --------------------------------------------------------------------
step "pip install -e common and the recipes (${PROJECTS[*]})"
EDITABLE=()
for project in "${PROJECTS[@]}"; do EDITABLE+=(-e "$REPO/$project"); done
pip_install --no-deps --no-build-isolation "${EDITABLE[@]}"

# --- 7b. perf_analyzer (never fails the setup; it says what is missing) ------------------------
step "Triton perf_analyzer (tritonclient 2.35.0 wheel) into $VENV/opt/perf_analyzer"
bash "$REPO/ci/install_perf_analyzer.sh" "$PY"

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
for name in ("numpy", "pandas", "pyarrow", "torch", "tensorflow-cpu", "tf-keras", "nvtabular", "merlin-core",
             "dask", "distributed", "pyspark", "torchrec", "fbgemm-gpu-cpu", "onnx", "onnxruntime",
             "tritonclient", "mlserver", "horovod", "pip"):
    got = metadata.version(name).split("+")[0]
    if pins.get(name) is not None and got != pins[name].split("+")[0]:
        bad.append(f"{name}: installed {got}, constraints.txt says {pins[name]}")
if bad:
    sys.exit("version drift:\n  " + "\n  ".join(bad))
import numpy, pandas, pyarrow, torch, tensorflow, tf_keras, nvtabular, merlin.dataloader, pyspark  # noqa: E401,F401
import torchrec, fbgemm_gpu, onnx, onnxruntime, onnxscript, tf2onnx, tritonclient.grpc, tritonclient.http  # noqa
import horovod.tensorflow, horovod.torch, recsys_common  # noqa
import dlrm, dlrm_dcnv2, wide_deep, neumf  # noqa: E401,F401  (the recipes, installed editable)
print(f"[setup] ok: torch {torch.__version__}, tensorflow {tensorflow.__version__}, numpy {numpy.__version__}, "
      f"pandas {pandas.__version__}, pyarrow {pyarrow.__version__}")
PYEOF
echo "$WANT_STAMP" > "$STAMP"
step "done: $VENV ready (use $VENV/bin/python; TF code needs TF_USE_LEGACY_KERAS=1)"
