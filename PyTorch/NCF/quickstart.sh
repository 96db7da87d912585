#!/usr/bin/env bash
# One-minute NCF on CPU: generate MovieLens-shaped data, convert it, train NeuMF, print HR@10 / NDCG@10.
#
#   bash PyTorch/NCF/quickstart.sh [work_dir]        (default work_dir: /tmp/ncf_quickstart)
#
# Uses the repository's .venv when present (make setup), else the python on PATH (needs torch, pandas, pyarrow,
# pyyaml and common/ importable, e.g. pip install -e common).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "${HERE}/../.." && pwd)"
WORK="${1:-/tmp/ncf_quickstart}"
PYTHON="${PYTHON:-$([[ -x "${REPO}/.venv/bin/python" ]] && echo "${REPO}/.venv/bin/python" || echo python)}"
export PYTHONPATH="${REPO}/common${PYTHONPATH:+:${PYTHONPATH}}"
cd "${HERE}"
PYTHON="${PYTHON}" bash preproc/prepare_dataset.sh synthetic "${WORK}/raw" "${WORK}/cache"
"${PYTHON}" ncf.py --data "${WORK}/cache/synthetic" -e 3 -b 4096 -l 0.005 -b1 0.9 -b2 0.999 -f 16 \
    --layers 32 16 8 --dropout 0 --seed 1 --checkpoint_dir "${WORK}/checkpoints" --log_path "${WORK}/log.json"
