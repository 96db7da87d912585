#!/usr/bin/env bash
# Regenerate ci/constraints.txt from a working environment (default: <repo>/.venv), after
# deliberately changing a pin in ci/requirements*.txt and re-running setup in a fresh venv:
#
#   RECSYS_VENV=/tmp/fresh/.venv bash ci/setup_env.sh && bash ci/freeze_constraints.sh /tmp/fresh/.venv
#
# Drops the editable installs (recsys-common, the recipes) and torch's local "+cpu" label (==2.13.0 still selects the CPU wheel).
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${RECSYS_VENV:-$REPO/.venv}}"
OUT="$REPO/ci/constraints.txt"
TMP="$(mktemp "$OUT.XXXXXX")"
trap 'rm -f "$TMP"' EXIT
{
  sed -n '1,/^[^#]/p' "$OUT" | sed '$d'   # keep the header comment
  "$VENV/bin/python" -m pip list --format=freeze --exclude-editable 2>/dev/null \
    | grep -viE '^recsys[-_]common==' \
    | sed -E 's/^([A-Za-z0-9._-]+==[^+]+)\+.*$/\1/' \
    | LC_ALL=C sort -f
} > "$TMP"
mv "$TMP" "$OUT"
trap - EXIT
echo "wrote $OUT ($(grep -vc '^#' "$OUT") pins) from $VENV"
