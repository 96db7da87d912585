#!/usr/bin/env bash
# Runs each component's test suite in its own pytest process, from its own directory, with the
# venv's python, then prints a per-component timing summary. Fails if any component fails.
#
#   bash ci/run_tests.sh                    # every component that has a tests/ directory
#   bash ci/run_tests.sh common PyTorch/NCF # just these (each must have tests/)
#
# Extra pytest arguments: PYTEST_ARGS="-x -k foo" bash ci/run_tests.sh ...
# (make test / make test-<component> call this after make setup.)
set -uo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${RECSYS_VENV:-$REPO/.venv}/bin/python"
ALL_COMPONENTS=(common ci PyTorch/NCF PyTorch/DLRM TensorFlow2/WideAndDeep TensorFlow2/DLRM_DCNv2)
read -r -a EXTRA <<< "${PYTEST_ARGS:-}"

[[ -x "$PY" ]] || { echo "[test] $PY not found: run 'make setup' (bash ci/setup_env.sh) first" >&2; exit 2; }
export TF_USE_LEGACY_KERAS="${TF_USE_LEGACY_KERAS:-1}"
export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

explicit=1
if [[ $# -eq 0 ]]; then set -- "${ALL_COMPONENTS[@]}"; explicit=0; fi

REPORT_DIR="$(mktemp -d "${TMPDIR:-/tmp}/recsys-tests.XXXXXX")"
trap 'rm -rf "$REPORT_DIR"' EXIT
declare -a NAMES=() RESULTS=() SECS=()
failed=0
for comp in "$@"; do
  comp="${comp%/}"
  if [[ ! -d "$REPO/$comp/tests" ]]; then
    if [[ $explicit == 1 ]]; then
      echo "[test] $comp has no tests/ directory" >&2; NAMES+=("$comp"); RESULTS+=("FAILED (no tests/)"); SECS+=(0); failed=1
    else
      NAMES+=("$comp"); RESULTS+=("skipped (no tests/ yet)"); SECS+=(0)
    fi
    continue
  fi
  echo
  echo "===================== [test] $comp: cd $comp && python -m pytest tests ====================="
  start=$SECONDS
  (cd "$REPO/$comp" && "$PY" -m pytest tests --junitxml="$REPORT_DIR/${comp//\//_}.xml" "${EXTRA[@]}")
  rc=$?
  NAMES+=("$comp"); SECS+=($((SECONDS - start)))
  case $rc in
    0) RESULTS+=("passed") ;;
    5) RESULTS+=("FAILED (no tests collected)"); failed=1 ;;
    *) RESULTS+=("FAILED (pytest exit $rc)"); failed=1 ;;
  esac
done

echo
echo "===================== [test] summary ====================="
for i in "${!NAMES[@]}"; do
  printf '  %-26s %6ss  %s\n' "${NAMES[$i]}" "${SECS[$i]}" "${RESULTS[$i]}"
done
"$PY" - "$REPORT_DIR" <<'PYEOF'
import glob, sys
import xml.etree.ElementTree as ET
passed = failed = skipped = 0
for path in glob.glob(sys.argv[1] + "/*.xml"):
    for suite in ET.parse(path).getroot().iter("testsuite"):
        tests, fails, errors, skips = (int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped"))
        passed += tests - fails - errors - skips
        failed += fails + errors
        skipped += skips
print(f"total: {passed} passed, {failed} failed, {skipped} skipped")
PYEOF
exit $failed
