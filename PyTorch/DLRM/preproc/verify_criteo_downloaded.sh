#!/usr/bin/env bash
# Check that a Criteo download is complete before hours of Spark work start.
#
#   ./verify_criteo_downloaded.sh [INPUT_PATH]
#
# Terabyte: day_0 .. day_N (N >= 1; the full dataset is day_0 .. day_23), each uncompressed or .gz, no gaps, none
# empty. Fewer than 24 days is allowed (small runs) with a warning: the last day present becomes test/validation.
# Kaggle: INPUT_PATH/train.txt (or .gz), or the file itself, not empty. Exit status 2 names what is wrong.
set -euo pipefail

input="${1:-${INPUT_PATH:-/data/dlrm/criteo}}"
die() { echo "verify_criteo_downloaded.sh: error: $*" >&2; exit 2; }

[[ -e "$input" ]] || die "$input does not exist"
if [[ -f "$input" ]]; then
    [[ -s "$input" ]] || die "$input is empty"
    [[ -r "$input" ]] || die "$input is not readable"
    echo "[verify] Kaggle layout: $input ($(du -hL "$input" | cut -f1))"
    exit 0
fi

shopt -s nullglob
days=("$input"/day_*)
if (( ${#days[@]} == 0 )); then
    for name in train.txt train.txt.gz; do
        if [[ -f "$input/$name" ]]; then
            [[ -s "$input/$name" ]] || die "$input/$name is empty"
            echo "[verify] Kaggle layout: $input/$name ($(du -hL "$input/$name" | cut -f1))"
            exit 0
        fi
    done
    die "$input holds neither day_0 .. day_23 (Criteo Terabyte) nor train.txt (Criteo Kaggle)"
fi

count=0
for (( day = 0; ; day++ )); do
    found=""
    for candidate in "$input/day_$day" "$input/day_$day.gz"; do
        if [[ -f "$candidate" ]]; then
            [[ -z "$found" ]] || die "day $day is present twice ($found and $candidate); keep one of them"
            found="$candidate"
        fi
    done
    [[ -z "$found" ]] && break
    [[ -s "$found" ]] || die "$found is empty (interrupted download?)"
    [[ -r "$found" ]] || die "$found is not readable"
    count=$((day + 1))
done
(( count == ${#days[@]} )) || die "day files must be day_0 .. day_N without gaps: found ${#days[@]} day_* files but day_$count is missing"
(( count >= 2 )) || die "found only day_0: the Terabyte layout needs at least two days"
if (( count < 24 )); then
    echo "[verify] warning: $count day(s), not the full Criteo Terabyte dataset (day_0 .. day_23); day_$((count - 1)) becomes test/validation" >&2
fi
echo "[verify] Terabyte layout: day_0 .. day_$((count - 1)) in $input ($(du -shL "$input" | cut -f1))"
