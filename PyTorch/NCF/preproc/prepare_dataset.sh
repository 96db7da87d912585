#!/usr/bin/env bash
# Download (when missing and the network allows) and convert a MovieLens dataset for ncf.py.
#
#   bash preproc/prepare_dataset.sh [ml-20m|ml-1m|ml-100k|synthetic|<name>] [raw_dir] [cache_dir]
#   (./prepare_dataset.sh, NVIDIA's name, runs this file)
#
#   ml-20m / ml-1m / ml-100k   GroupLens zip -> RAW_DIR/<name>.zip (checked against GroupLens' MD5), unzipped into
#                              RAW_DIR/<name>/, converted into CACHE_DIR/<name>/ (feature_spec.yaml + parquet)
#   synthetic                  a generated MovieLens-shaped CSV (synthetic.py), then converted the same way
#   <name>                     your own data: RAW_DIR/<name>/ratings.csv with header user_id,item_id,timestamp
#
# Defaults: RAW_DIR=/data, CACHE_DIR=RAW_DIR/cache. Extra convert.py flags via CONVERT_ARGS, e.g.
# CONVERT_ARGS="--valid_negative 99 --seed 3". Returns at once if CACHE_DIR/<name>/feature_spec.yaml exists.
set -euo pipefail

DATASET="${1:-ml-20m}"
RAW_DIR="${2:-/data}"
CACHE_DIR="${3:-${RAW_DIR}/cache}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"   # the recipe directory (this file is in preproc/)
REPO="$(cd "${HERE}/../.." && pwd)"
# the repository's .venv when present (make setup), else python3; PYTHON=... overrides
PYTHON="${PYTHON:-$([[ -x "${REPO}/.venv/bin/python" ]] && echo "${REPO}/.venv/bin/python" || echo python3)}"
export PYTHONPATH="${HERE}:${REPO}/common${PYTHONPATH:+:${PYTHONPATH}}"   # neumf and recsys_common, installed or not
OUT="${CACHE_DIR}/${DATASET}"

if [[ -f "${OUT}/feature_spec.yaml" ]]; then
    echo "prepare_dataset.sh: ${OUT} already prepared; remove it to redo"
    exit 0
fi

declare -A RATINGS=( [ml-20m]="ml-20m/ratings.csv" [ml-1m]="ml-1m/ratings.dat" [ml-100k]="ml-100k/u.data" )
# MD5 of the GroupLens archives, as GroupLens publishes them (files.grouplens.org/datasets/movielens/<name>.zip.md5)
declare -A MD5=(
    [ml-20m]="cd245b17a1ae2cc31bb14903e1204af3"
    [ml-1m]="c4d9eecfca2ab87c1945afe126590906"
    [ml-100k]="0e33842e24a9c977be4e0107933c0723"
)

fetch_grouplens() {
    local name="$1" zip="${RAW_DIR}/${1}.zip" url="https://files.grouplens.org/datasets/movielens/${1}.zip"
    mkdir -p "${RAW_DIR}"
    if [[ ! -f "${zip}" ]]; then
        echo "prepare_dataset.sh: downloading ${url}"
        if ! curl -fL --retry 3 -o "${zip}.part" "${url}" 2>/dev/null && \
           ! wget -q -O "${zip}.part" "${url}" 2>/dev/null; then
            rm -f "${zip}.part"
            echo "prepare_dataset.sh: error: could not download ${url}." >&2
            echo "  Download it yourself and put it at ${zip} (or unzip it so that ${RAW_DIR}/${RATINGS[$name]} exists)." >&2
            exit 1
        fi
        mv "${zip}.part" "${zip}"
    fi
    local got
    got="$(md5sum "${zip}" | cut -d' ' -f1)"
    if [[ "${got}" != "${MD5[$name]}" ]]; then
        echo "prepare_dataset.sh: error: ${zip} has MD5 ${got}, expected ${MD5[$name]} (corrupt or partial download; delete it and retry)" >&2
        exit 1
    fi
    "${PYTHON}" -c "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])" "${zip}" "${RAW_DIR}"
}

case "${DATASET}" in
    ml-20m|ml-1m|ml-100k)
        RAW_FILE="${RAW_DIR}/${RATINGS[$DATASET]}"
        [[ -f "${RAW_FILE}" ]] || fetch_grouplens "${DATASET}"
        ;;
    synthetic)
        RAW_FILE="${RAW_DIR}/synthetic/ratings.csv"
        [[ -f "${RAW_FILE}" ]] || "${PYTHON}" "${HERE}/synthetic.py" --output "${RAW_FILE}" ${SYNTHETIC_ARGS:-}
        ;;
    *)
        RAW_FILE="${RAW_DIR}/${DATASET}/ratings.csv"
        if [[ ! -f "${RAW_FILE}" ]]; then
            echo "prepare_dataset.sh: error: ${RAW_FILE} not found: put your interactions there as a CSV with the header user_id,item_id,timestamp" >&2
            exit 1
        fi
        ;;
esac

"${PYTHON}" "${HERE}/convert.py" --path "${RAW_FILE}" --output "${OUT}" ${CONVERT_ARGS:-}
