# Sourced (not run) by the recipes' shell entry points (quickstart.sh, deployment/serve_quickstart.sh) once they have
# changed into the recipe's directory: the one place that picks the interpreter and makes the recipe and
# recsys_common importable, in a checkout (common/ is ../../common) and in the Docker images (/workspace/common).
#   Sets REPO (the directory holding common/), PY (PYTHON when it names an executable file, else REPO/.venv's
#   python when there is one, else python3), and exports PYTHONPATH = the recipe directory : common : the caller's.
COMMON_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(dirname "$COMMON_DIR")"
PY="${PYTHON:-$REPO/.venv/bin/python}"
[[ -x "$PY" ]] || PY=python3
export PYTHONPATH="$PWD:$COMMON_DIR${PYTHONPATH:+:$PYTHONPATH}"
