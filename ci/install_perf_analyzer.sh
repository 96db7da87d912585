#!/usr/bin/env bash
# Triton's perf_analyzer for the serving tests and users, outside the Python environment's tritonclient (2.73, which
# no longer ships the binary), run by ci/setup_env.sh:
#
#   bash ci/install_perf_analyzer.sh <venv>/bin/python
#
# Puts into <venv>/opt/perf_analyzer/:
#   bin/perf_analyzer   from the tritonclient==2.35.0 wheel (tritonclient-2.35.0.data/data/bin/perf_analyzer; later
#                       wheels dropped it, and the separate perf-analyzer package needs glibc 2.38, Debian 12 has 2.36)
#   lib/libcudart.so.12 from the nvidia-cuda-runtime-cu12==12.4.127 wheel (the binary links it; no GPU is needed)
#   perf_analyzer       a wrapper that sets LD_LIBRARY_PATH and runs bin/perf_analyzer
# The binary also needs libb64.so.0d (Debian package libb64-0d), which ci/system_packages.sh installs (this script
# only warns when it is missing). Idempotent: a working install is left as it is. Never fails the setup: without
# perf_analyzer only the perf_analyzer tests fail, with this script's message.
set -uo pipefail

PY="${1:?usage: install_perf_analyzer.sh <venv python>}"
TRITONCLIENT_VERSION="2.35.0"
CUDART_VERSION="12.4.127"
DEST="$("$PY" -c 'import sys; print(sys.prefix)')/opt/perf_analyzer"
say() { printf '[setup] perf_analyzer: %s\n' "$*"; }

works() {
  # with no -m, a perf_analyzer that loads prints "-m flag must be specified" (exit 99); a missing library is exit 127
  local out
  out="$("$DEST/perf_analyzer" 2>&1)"
  [[ "$out" == *"-m flag must be specified"* ]]
}

if [[ -x "$DEST/perf_analyzer" ]] && works; then
  say "already installed: $DEST/perf_analyzer"
  exit 0
fi

if ! /sbin/ldconfig -p 2>/dev/null | grep -q 'libb64\.so\.0d'; then
  # ci/system_packages.sh (step 0 of ci/setup_env.sh) is the one place that installs system packages
  say "WARNING: libb64.so.0d missing; 'bash ci/system_packages.sh' installs it (Debian/Ubuntu package libb64-0d)"
fi

TMP="$(mktemp -d "${TMPDIR:-/tmp}/perf_analyzer.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
say "downloading tritonclient==$TRITONCLIENT_VERSION and nvidia-cuda-runtime-cu12==$CUDART_VERSION wheels"
if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
      --platform manylinux1_x86_64 --platform manylinux2014_x86_64 -d "$TMP/wheels" \
      "tritonclient==$TRITONCLIENT_VERSION" "nvidia-cuda-runtime-cu12==$CUDART_VERSION" 2>&1 \
      | { grep -v "^WARNING: Location 'file:" || true; }; then
  say "WARNING: download failed; perf_analyzer not installed (the perf_analyzer tests will fail)"
  exit 0
fi
# extract into a staging directory and rename it into place, so a failed run leaves no half-installed copy
"$PY" - "$TMP/wheels" "$TMP/stage" <<'PYEOF' || { say "WARNING: extracting the wheels failed"; exit 0; }
import glob, os, stat, sys, zipfile
wheels, stage = sys.argv[1], sys.argv[2]
os.makedirs(os.path.join(stage, "bin")); os.makedirs(os.path.join(stage, "lib"))
for pattern, member, target in (
        ("tritonclient-*.whl", "tritonclient-2.35.0.data/data/bin/perf_analyzer", "bin/perf_analyzer"),
        ("nvidia_cuda_runtime_cu12-*.whl", "nvidia/cuda_runtime/lib/libcudart.so.12", "lib/libcudart.so.12")):
    (wheel,) = glob.glob(os.path.join(wheels, pattern))
    with zipfile.ZipFile(wheel) as z, open(os.path.join(stage, target), "wb") as out:
        out.write(z.read(member))
    os.chmod(os.path.join(stage, target), 0o755)
with open(os.path.join(stage, "perf_analyzer"), "w") as f:
    f.write('#!/bin/sh\n# Triton perf_analyzer (tritonclient 2.35.0 wheel) with its libcudart; see ci/install_perf_analyzer.sh\n'
            'here="$(dirname "$(readlink -f "$0")")"\n'
            'LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/bin/perf_analyzer" "$@"\n')
os.chmod(os.path.join(stage, "perf_analyzer"), 0o755)
PYEOF
mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST.old"
[[ -e "$DEST" ]] && mv "$DEST" "$DEST.old"
mv "$TMP/stage" "$DEST" && rm -rf "$DEST.old"
if works; then
  say "installed $DEST/perf_analyzer"
else
  say "WARNING: $DEST/perf_analyzer does not run here: $("$DEST/perf_analyzer" 2>&1 | head -n 2)"
fi
exit 0
