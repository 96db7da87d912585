#!/usr/bin/env bash
# Horovod 0.28.1 (the last release) into the project's venv, for multi-process TensorFlow runs (horovodrun) and
# their tests. Not part of ci/setup_env.sh: it compiles for about 8 minutes on 2 cores the first time, and no
# single-process recipe or quickstart needs it.
#
#   bash ci/setup_horovod.sh          (or: make setup-horovod; make test does it after make setup)
#
# Built from its PyPI sdist with ci/horovod-0.28.1-tf2.21-torch2.13.patch (gloo, TensorFlow + PyTorch; why the
# patch: ../shared/reference/environment.md, "Horovod 0.28.1 against TF 2.21 and torch 2.13"). The wheel is cached
# in $RECSYS_WHEEL_CACHE (default ~/.cache/recsys-recipes/wheels) under a key of the patch, the Python, TF and torch
# versions, so a later setup (or a new venv on the same machine) installs it in seconds. A no-op when the installed
# Horovod already loads with both frameworks.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RECSYS_VENV:-$REPO/.venv}"
PY="$VENV/bin/python"
WHEEL_CACHE="${RECSYS_WHEEL_CACHE:-$HOME/.cache/recsys-recipes/wheels}"
CONSTRAINTS="$REPO/ci/constraints.txt"
PATCH="$REPO/ci/horovod-0.28.1-tf2.21-torch2.13.patch"
HOROVOD_VERSION="0.28.1"
read -r -a EXTRA_PIP_ARGS <<< "${RECSYS_PIP_ARGS:-}"
T0=$SECONDS
step() { printf '[setup-horovod %4ss] %s\n' "$((SECONDS - T0))" "$*"; }
die() { printf '[setup-horovod] ERROR: %s\n' "$*" >&2; exit 1; }
[[ -x "$PY" ]] || die "$PY not found: run 'make setup' (bash ci/setup_env.sh) first"
[[ -f "$PATCH" ]] || die "missing $PATCH (run this script from a full checkout)"
pip_install() {
  "$PY" -m pip install --progress-bar off -q -c "$CONSTRAINTS" "${EXTRA_PIP_ARGS[@]}" "$@" 2>&1 \
    | { grep -v "^WARNING: Location 'file:" || true; }
}


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

