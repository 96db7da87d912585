# Sourced (not run) by the recipes' shell entry points (quickstart.sh, deployment/serve_quickstart.sh) once they have
# changed into the recipe's directory: the one place that picks the interpreter and makes the recipe and
# recsys_common importable, in a checkout (common/ is ../../common) and in the Docker images (/workspace/common).
#   Sets REPO (the directory holding common/), PY (PYTHON when set, a path or a command name; else REPO/.venv's
#   python when there is one, else python3), and exports PYTHONPATH = the recipe directory : common : the caller's.
COMMON_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$COMMON_DIR")"
if [[ -n "${PYTHON:-}" ]]; then
    PY="$(command -v "$PYTHON" || true)"   # a path or a command name (python3.12)
    [[ -n "$PY" ]] || { echo "error: PYTHON=$PYTHON: no such interpreter" >&2; return 1; }
elif [[ -x "$REPO/.venv/bin/python" ]]; then
    PY="$REPO/.venv/bin/python"
else
    PY=python3
fi
export PYTHONPATH="$PWD:$COMMON_DIR${PYTHONPATH:+:$PYTHONPATH}"
