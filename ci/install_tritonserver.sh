#!/usr/bin/env bash
# A real Triton Inference Server (2.51, CPU, Python backend only) for the serving tests and users, run by
# ci/setup_env.sh:
#
#   bash ci/install_tritonserver.sh <venv>/bin/python
#
# Puts into <venv>/opt/tritonserver/ (the layout of the nvidia-pytriton wheel, so the binaries' RPATHs find their
# libraries without LD_LIBRARY_PATH):
#   pytriton/tritonserver/bin/tritonserver          from the nvidia-pytriton==0.7.0 wheel (Triton 2.51, NVIDIA's
#                                                   24.10 build; needs glibc 2.35+)
#   pytriton/tritonserver/backends/python/          the Python backend (libtriton_python.so,
#                                                   triton_python_backend_utils.py) and the Python 3.11 stub
#                                                   (python_backend_stubs/3.11 of the wheel): --backend-directory
#   nvidia_pytriton.libs/                           the libraries the binaries link
#   stub-env/                                       the interpreter the Python backend's stub embeds: a venv holding
#                                                   numpy==1.26.4 only, with the main venv's site-packages after it
#   LICENSE                                         the wheel's licence
# Why stub-env: the stub was built against numpy 1.x; under the main venv's numpy 2 its as_numpy() returns wrong
# values (every element equal to the first) and BYTES inputs crash the stub, because numpy 2 moved the dtype's item
# size. The stub runs whatever `python3` comes first on PATH, so recsys_common.serving.triton_server puts
# stub-env/bin first; torch, onnxruntime and TensorFlow (built against numpy 2, which keeps the 1.x ABI) run there.
# Idempotent: a working install is left as it is. Never fails the setup (as ci/install_perf_analyzer.sh): without
# it only the serving tests fail, with the launcher's message naming this script.
set -uo pipefail

PY="${1:?usage: install_tritonserver.sh <venv python>}"
PYTRITON_VERSION="0.7.0"
STUB_NUMPY_VERSION="1.26.4"
DEST="$("$PY" -c 'import sys; print(sys.prefix)')/opt/tritonserver"
MAIN_SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
say() { printf '[setup] tritonserver: %s\n' "$*"; }

works() {
  # the server binary loads its libraries, and the stub's interpreter has numpy 1.x and the main venv's packages
  # (--help exits non-zero; a binary that cannot load a library prints no usage)
  [[ "$("$DEST/pytriton/tritonserver/bin/tritonserver" --help 2>&1)" == *"Usage: tritonserver"* ]] || return 1
  [[ -x "$DEST/pytriton/tritonserver/backends/python/triton_python_backend_stub" ]] || return 1
  [[ "$("$DEST/stub-env/bin/python3" -c 'import numpy, recsys_common; print(numpy.__version__)' 2>/dev/null)" \
     == "$STUB_NUMPY_VERSION" ]]
}

if [[ -d "$DEST" ]] && works && [[ "$(cat "$DEST/VERSION" 2>/dev/null)" == "$PYTRITON_VERSION $STUB_NUMPY_VERSION" ]]
then
  say "already installed: $DEST"
  exit 0
fi

if ! "$PY" -c 'import os, sys; v = os.confstr("CS_GNU_LIBC_VERSION").split()[1]; \
               sys.exit(tuple(map(int, v.split(".")[:2])) < (2, 35))' 2>/dev/null; then
  say "WARNING: glibc older than 2.35; the nvidia-pytriton tritonserver does not run here (serving tests will fail)"
  exit 0
fi

TMP="$(mktemp -d "${TMPDIR:-/tmp}/tritonserver.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT
say "downloading nvidia-pytriton==$PYTRITON_VERSION (55 MB) and numpy==$STUB_NUMPY_VERSION wheels"
if ! "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \
      --platform manylinux_2_35_x86_64 --platform manylinux_2_17_x86_64 -d "$TMP/wheels" \
      "nvidia-pytriton==$PYTRITON_VERSION" "numpy==$STUB_NUMPY_VERSION" 2>&1 \
      | { grep -v "^WARNING: Location 'file:" || true; }; then
  say "WARNING: download failed; tritonserver not installed (the serving tests will fail)"
  exit 0
fi
# extract into a staging directory and rename it into place, so a failed run leaves no half-installed copy
"$PY" - "$TMP/wheels" "$TMP/stage" <<'PYEOF' || { say "WARNING: extracting the wheel failed"; exit 0; }
import glob, os, shutil, sys, zipfile
wheels, stage = sys.argv[1], sys.argv[2]
server = "pytriton/tritonserver/"
stub = server + "python_backend_stubs/3.11/triton_python_backend_stub"
(wheel,) = glob.glob(os.path.join(wheels, "nvidia_pytriton-*.whl"))
with zipfile.ZipFile(wheel) as z:
    for info in z.infolist():
        name = info.filename
        keep = (name.startswith(server + "bin/") or name.startswith(server + "backends/python/")
                or name.startswith("nvidia_pytriton.libs/") or name == stub)
        if keep and not name.endswith("/") and "__pycache__" not in name:
            z.extract(info, stage)
            os.chmod(os.path.join(stage, name), (info.external_attr >> 16) & 0o777 or 0o644)
    licence = [n for n in z.namelist() if n.endswith(".dist-info/licenses/LICENSE")]
    with open(os.path.join(stage, "LICENSE"), "wb") as out:
        out.write(z.read(licence[0]))
# the Python 3.11 stub where the backend looks for it; the wheel's default stub there is for another Python
backend = os.path.join(stage, server, "backends", "python")
shutil.move(os.path.join(stage, stub), os.path.join(backend, "triton_python_backend_stub"))
shutil.rmtree(os.path.join(stage, server, "python_backend_stubs"))
for path in (os.path.join(stage, server, "bin", "tritonserver"), os.path.join(backend, "triton_python_backend_stub")):
    os.chmod(path, 0o755)
PYEOF
"$PY" -m venv --without-pip "$TMP/stage/stub-env" || { say "WARNING: creating stub-env failed"; exit 0; }
STUB_SITE="$("$TMP/stage/stub-env/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
"$PY" -m pip install -q --no-deps --no-index --target "$STUB_SITE" "$TMP"/wheels/numpy-*.whl 2>&1 \
  | { grep -v "^WARNING: Location 'file:" || true; }
# after stub-env's own numpy, the main venv's packages (addsitedir also runs their .pth files: the editable installs)
printf "import site; site.addsitedir(%s)\n" "$("$PY" -c 'import sys; print(repr(sys.argv[1]))' "$MAIN_SITE")" \
  > "$STUB_SITE/zz_recsys_main_venv.pth"
echo "$PYTRITON_VERSION $STUB_NUMPY_VERSION" > "$TMP/stage/VERSION"
mkdir -p "$(dirname "$DEST")"
rm -rf "$DEST.old"
[[ -e "$DEST" ]] && mv "$DEST" "$DEST.old"
# a venv moves whole (sys.prefix comes from where bin/python3 is; only the unused activate scripts name the old path)
mv "$TMP/stage" "$DEST" && rm -rf "$DEST.old"
if works; then
  say "installed $DEST (tritonserver 2.51 with the Python backend)"
else
  say "WARNING: $DEST does not run here: $("$DEST/pytriton/tritonserver/bin/tritonserver" --help 2>&1 | head -n 2)"
fi
exit 0
