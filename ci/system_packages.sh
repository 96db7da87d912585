#!/usr/bin/env bash
# The one place that decides which Debian/Ubuntu system packages the stack needs, run by ci/setup_env.sh
# before the virtual environment is built:
#
#   bash ci/system_packages.sh [--print] [--python PY]
#
# What is needed, and why (a package is asked for only when its check fails):
#   java >= 17 (JAVA_HOME/bin/java, else java on PATH)   openjdk-17-jre-headless  pyspark 4 (Criteo ETL, Spark tests)
#   gcc, g++, make                                        build-essential          the Horovod build
#   cmake                                                 cmake                    the Horovod build
#   patch                                                 patch                    ci/horovod-*.patch
#   libb64.so.0d (ldconfig -p)                            libb64-0d                Triton's perf_analyzer
#   Python 3.11 (PYTHON / --python, else python3.11,      python3.11               the venv
#     else python3 when it is 3.11)
#   its ensurepip module                                  python3.11-venv          python -m venv (Debian splits it out)
#   its Python.h                                          python3.11-dev           the Horovod build
#
# Nothing missing: says so, exit 0. Something missing and running as root with apt-get: one `apt-get update`,
# then `apt-get install -y --no-install-recommends <packages>` (exit status of apt). Not root: stops at once
# (exit 1), printing the one command to run. No apt-get: stops, naming the Debian packages.
#   --print        decide and print only: as root it prints the apt-get command lines it would run, exit 0
#   --python PY    the interpreter to check (ci/setup_env.sh passes the venv's when it exists)
#
# Environment knobs (the test, ci/tests/test_system_packages.py, uses the first two to run without root or network):
#   RECSYS_SYSPKG_PATH            where to look for the commands above (default: $PATH:/usr/local/sbin:/usr/sbin:/sbin)
#   RECSYS_SYSPKG_UID             the user id that decides root or not (default: `id -u`)
#   RECSYS_SKIP_SYSTEM_PACKAGES=1 report what is missing as a warning and go on (non-Debian machines, no sudo)
set -euo pipefail

PRINT_ONLY=0
CHECK_PY="${PYTHON:-}"
while (($#)); do
  case "$1" in
    --print) PRINT_ONLY=1 ;;
    --python) CHECK_PY="${2:?--python needs a path}"; shift ;;
    *) echo "usage: system_packages.sh [--print] [--python PY]" >&2; exit 2 ;;
  esac
  shift
done
LOOKUP="${RECSYS_SYSPKG_PATH:-$PATH:/usr/local/sbin:/usr/sbin:/sbin}"
USER_ID="${RECSYS_SYSPKG_UID:-$(id -u)}"
say() { printf '[setup] system packages: %s\n' "$*"; }

# like `command -v`, but over $LOOKUP only (so the test can hide this machine's real java or cmake)
find_cmd() {
  local dir IFS=:
  for dir in $LOOKUP; do
    [[ -n "$dir" && -f "$dir/$1" && -x "$dir/$1" ]] && { printf '%s\n' "$dir/$1"; return 0; }
  done
  return 1
}

PACKAGES=()
REASONS=()
need() { [[ " ${PACKAGES[*]} " == *" $1 "* ]] || { PACKAGES+=("$1"); REASONS+=("$1 ($2)"); }; }

# --- Java >= 17 (pyspark 4 refuses older ones) ---------------------------------------------------
JAVA=""
if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then JAVA="$JAVA_HOME/bin/java"; else JAVA="$(find_cmd java || true)"; fi
if [[ -z "$JAVA" ]]; then
  need openjdk-17-jre-headless "no java"
else
  # `openjdk version "17.0.15" 2025-04-15`, `java version "1.8.0_392"`
  JAVA_VERSION="$("$JAVA" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n 1 || true)"
  JAVA_MAJOR="${JAVA_VERSION%%.*}"
  [[ "$JAVA_MAJOR" == 1 ]] && { JAVA_MAJOR="${JAVA_VERSION#1.}"; JAVA_MAJOR="${JAVA_MAJOR%%.*}"; }
  JAVA_MAJOR="${JAVA_MAJOR%%[!0-9]*}"
  if [[ -z "$JAVA_MAJOR" ]] || ((JAVA_MAJOR < 17)); then
    need openjdk-17-jre-headless "$JAVA is java ${JAVA_VERSION:-of unknown version}, pyspark 4 needs 17+"
  fi
fi

# --- compilers and tools for the Horovod build -------------------------------------------------------
for tool in gcc g++ make; do
  find_cmd "$tool" >/dev/null || need build-essential "no $tool"
done
find_cmd cmake >/dev/null || need cmake "no cmake"
find_cmd patch >/dev/null || need patch "no patch"

# --- libb64 for perf_analyzer -------------------------------------------------------------------------
LDCONFIG="$(find_cmd ldconfig || true)"
if [[ -z "$LDCONFIG" ]] || ! "$LDCONFIG" -p 2>/dev/null | grep -q 'libb64\.so\.0d'; then
  need libb64-0d "no libb64.so.0d"
fi

# --- Python 3.11 with venv and headers ---------------------------------------------------------------
PY_EXPLICIT=1
if [[ -z "$CHECK_PY" ]]; then
  PY_EXPLICIT=0
  if CHECK_PY="$(find_cmd python3.11)"; then :
  elif CHECK_PY="$(find_cmd python3)" && [[ "$("$CHECK_PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)" == 3.11 ]]; then :
  else CHECK_PY=""
  fi
fi
if [[ -z "$CHECK_PY" ]]; then
  need python3.11 "no Python 3.11"; need python3.11-venv "no Python 3.11"; need python3.11-dev "no Python 3.11"
else
  # prints e.g. "3.11 1 1": version, ensurepip importable, Python.h present
  PROBE="$("$CHECK_PY" -c 'import importlib.util, os, sys, sysconfig
print("%d.%d" % sys.version_info[:2], int(importlib.util.find_spec("ensurepip") is not None),
      int(os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h"))))' 2>/dev/null || true)"
  read -r PY_VERSION HAS_ENSUREPIP HAS_HEADERS <<< "${PROBE:-? 0 0}"
  if [[ "$PY_VERSION" == 3.11 ]]; then
    [[ "$HAS_ENSUREPIP" == 1 ]] || need python3.11-venv "$CHECK_PY has no ensurepip (python -m venv fails)"
    [[ "$HAS_HEADERS" == 1 ]] || need python3.11-dev "$CHECK_PY has no Python.h"
  elif ((PY_EXPLICIT == 0)); then
    need python3.11 "$CHECK_PY does not run as Python 3.11"
  fi  # an explicit non-3.11 interpreter is ci/setup_env.sh's error to report, not a package to install
fi

# --- decide ---------------------------------------------------------------------------------------------
if ((${#PACKAGES[@]} == 0)); then
  say "nothing to install (java ${JAVA_VERSION:-?}, gcc, g++, make, cmake, patch, libb64, Python ${PY_VERSION:-?} with venv and headers)"
  exit 0
fi
say "missing: $(IFS=';'; echo "${REASONS[*]}" | sed 's/;/; /g')"
INSTALL=(apt-get install -y --no-install-recommends "${PACKAGES[@]}")
if [[ "${RECSYS_SKIP_SYSTEM_PACKAGES:-0}" == 1 ]]; then
  say "WARNING: RECSYS_SKIP_SYSTEM_PACKAGES=1: going on without them (Debian/Ubuntu: sudo ${INSTALL[*]})"
  exit 0
fi
if ! APT="$(find_cmd apt-get)"; then
  say "ERROR: no apt-get here: install the equivalents of these Debian packages, then run the setup again" \
      "(or set RECSYS_SKIP_SYSTEM_PACKAGES=1 to go on without them): ${PACKAGES[*]}" >&2
  exit 1
fi
if [[ "$USER_ID" != 0 ]]; then
  say "ERROR: not root, so nothing was installed. Run this one command, then the setup again" \
      "(if apt cannot find a package, run 'sudo apt-get update' first):" >&2
  printf '  sudo %s\n' "${INSTALL[*]}" >&2
  exit 1
fi
if ((PRINT_ONLY)); then
  say "would run: apt-get update -q"
  say "would run: ${INSTALL[*]}"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# openjdk's postinst fails on slim images that drop /usr/share/man (debian:*-slim); the directory is harmless
[[ " ${PACKAGES[*]} " == *" openjdk-17-jre-headless "* ]] && mkdir -p /usr/share/man/man1
say "running: apt-get update -q"
"$APT" update -q
say "running: ${INSTALL[*]}"
"$APT" "${INSTALL[@]:1}"
say "installed: ${PACKAGES[*]}"
