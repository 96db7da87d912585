#!/usr/bin/env bash
# Build one recipe's image with the repository root as the build context (the images need common/).
#
#   docker/build.sh [--dry-run] [--tag TAG] <model-dir> [extra docker build args...]
#   docker/build.sh PyTorch/NCF                      -> recsys/pytorch-ncf:latest
#   docker/build.sh TensorFlow2/WideAndDeep          -> recsys/tensorflow2-wideanddeep:latest
#   docker/build.sh --dry-run TensorFlow2/DLRM_DCNv2 -> prints the command only
#
# The context is streamed as a tar of the working tree without .git, .venv, caches and results,
# so a multi-GB .venv never reaches the Docker daemon (no root .dockerignore is needed).
# Inside the Dockerfile, paths are relative to the repository root: COPY common/ ..., COPY PyTorch/NCF/ ...
set -euo pipefail

usage() { sed -n '2,10p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DRY_RUN=0
TAG=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run|-n) DRY_RUN=1; shift ;;
    --tag|-t) [[ $# -ge 2 ]] || usage; TAG="$2"; shift 2 ;;
    -h|--help) usage ;;
    --) shift; break ;;
    -*) echo "build.sh: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
[[ $# -ge 1 ]] || usage
MODEL_DIR="${1%/}"; shift

# The model directory must be inside the repository (relative to its root).
case "$MODEL_DIR" in
  /*|*..*) echo "build.sh: give the model directory relative to the repository root, e.g. PyTorch/NCF (got '$MODEL_DIR')" >&2; exit 2 ;;
esac
if [[ ! -d "$REPO/$MODEL_DIR" ]]; then
  echo "build.sh: no directory '$MODEL_DIR' in $REPO" >&2; exit 1
fi
DOCKERFILE="$MODEL_DIR/Dockerfile"
if [[ ! -f "$REPO/$DOCKERFILE" ]]; then
  echo "build.sh: $DOCKERFILE not found (each recipe writes its own; see docker/Dockerfile.template)" >&2; exit 1
fi

# recsys/<framework>-<model>, lower case, '_' -> '-': PyTorch/DLRM -> recsys/pytorch-dlrm
NAME="$(printf '%s' "$MODEL_DIR" | tr '[:upper:]' '[:lower:]' | tr '/_' '--')"
TAG="${TAG:-recsys/$NAME:latest}"

TAR_CMD=(tar -C "$REPO" -c --exclude=./.git --exclude=./.venv --exclude='__pycache__' --exclude='*.pyc'
         --exclude='.pytest_cache' --exclude='*.egg-info' --exclude=./results --exclude=./build --exclude=./.cache .)
BUILD_CMD=(docker build -f "$DOCKERFILE" -t "$TAG" "$@" -)

if [[ $DRY_RUN == 1 ]]; then
  printf '%q ' "${TAR_CMD[@]}"; printf '| '; printf '%q ' "${BUILD_CMD[@]}"; echo
  exit 0
fi
command -v docker >/dev/null 2>&1 || { echo "build.sh: docker not found" >&2; exit 1; }
echo "[docker] building $TAG from $DOCKERFILE (context: $REPO)"
"${TAR_CMD[@]}" | "${BUILD_CMD[@]}"
echo "[docker] built $TAG"
