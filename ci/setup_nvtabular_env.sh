#!/usr/bin/env bash
# The separate NVTabular environment, <repo>/.venv-nvtabular (RECSYS_NVTABULAR_VENV): NVTabular 23.8 with its 2023
# pins (ci/nvtabular-env/requirements.txt says why it is separate), plus editable recsys_common and wide_deep with
# --no-deps, so that `python -m wide_deep.data.outbrain.preproc --engine nvtabular` and
# `python -m wide_deep.movielens.etl --engine nvtabular` run in it. The default environment (.venv) holds no
# NVTabular; the tests that hold the default engines equal to NVTabular's run it as a subprocess.
#
#   bash ci/setup_nvtabular_env.sh      (or: make setup-nvtabular; make test does it)
#
# A no-op while its stamp (a hash of this script, the requirement list, the constraints and the two pyproject
# files) matches; RECSYS_SETUP_FORCE=1 redoes it. About a minute on a new machine.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${RECSYS_NVTABULAR_VENV:-$REPO/.venv-nvtabular}"
REQS="$REPO/ci/nvtabular-env/requirements.txt"
CONSTRAINTS="$REPO/ci/nvtabular-env/constraints.txt"
STAMP="$VENV/.recsys-setup-stamp"
read -r -a EXTRA_PIP_ARGS <<< "${RECSYS_PIP_ARGS:-}"
T0=$SECONDS
step() { printf '[setup-nvtabular %4ss] %s\n' "$((SECONDS - T0))" "$*"; }
die() { printf '[setup-nvtabular] ERROR: %s\n' "$*" >&2; exit 1; }

WANT_STAMP="$(cat "${BASH_SOURCE[0]}" "$REQS" "$CONSTRAINTS" "$REPO/common/pyproject.toml" \
              "$REPO/TensorFlow2/WideAndDeep/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [[ "${RECSYS_SETUP_FORCE:-0}" != 1 && -x "$VENV/bin/python" && -f "$STAMP" \
      && "$(cat "$STAMP")" == "$WANT_STAMP" ]]; then
  step "environment $VENV is up to date (stamp matches)"
  exit 0
fi

if [[ ! -x "$VENV/bin/python" ]]; then
  PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"
  [[ "$("$PYTHON" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" == 3.11 ]] \
    || die "Python 3.11 not found: set PYTHON=/path/to/python3.11"
  step "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
pip_install() {
  "$PY" -m pip install --progress-bar off -q -c "$CONSTRAINTS" "${EXTRA_PIP_ARGS[@]}" "$@" 2>&1 \
    | { grep -v "^WARNING: Location 'file:" || true; }
}
step "pip==26.2.1 (26.3 refuses merlin-dataloader's direct-URL dependency), setuptools, wheel"
pip_install pip==26.2.1 setuptools wheel
step "NVTabular 23.8 and its pins (ci/nvtabular-env/requirements.txt)"
pip_install -r "$REQS"
step "editable recsys_common and wide_deep (--no-deps)"
pip_install --no-deps --no-build-isolation -e "$REPO/common" -e "$REPO/TensorFlow2/WideAndDeep"
"$PY" - <<'PYEOF' 2>&1 | { grep -v "dtype mappings did not load\|warn(f" || true; }
import nvtabular, merlin.io, pyarrow, pyarrow_hotfix, pandas, numpy, recsys_common, wide_deep  # noqa: F401
print(f"[setup-nvtabular] ok: nvtabular {nvtabular.__version__}, pandas {pandas.__version__}, "
      f"numpy {numpy.__version__}, pyarrow {pyarrow.__version__} (+ pyarrow-hotfix)")
PYEOF
echo "$WANT_STAMP" > "$STAMP"
step "done: $VENV"
