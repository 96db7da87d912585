#!/usr/bin/env bash
# Regenerate ci/constraints.txt from a working environment (default: <repo>/.venv), after
# deliberately changing a pin in ci/requirements*.txt and re-running setup in a fresh venv:
#
#   RECSYS_VENV=/tmp/fresh/.venv make setup setup-horovod && bash ci/freeze_constraints.sh /tmp/fresh/.venv
#
# Every installed package but the editable ones (recsys-common, the recipes), exactly, each with why it is there:
# "top-level" (named in ci/requirements*.txt, or installed by a setup script) or "via" the installed packages that
# require it. torch's local "+cpu" label is dropped (==2.13.0 still selects the CPU wheel). The header comment of the
# existing file (the pins held behind their latest release, and why) is kept.
set -euo pipefail
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${1:-${RECSYS_VENV:-$REPO/.venv}}"
OUT="$REPO/ci/constraints.txt"
TMP="$(mktemp "$OUT.XXXXXX")"
trap 'rm -f "$TMP"' EXIT
{
  sed -n '1,/^[^#]/p' "$OUT" | sed '$d'   # keep the header comment
  "$VENV/bin/python" - "$REPO/ci/requirements.txt" "$REPO/ci/requirements-nodeps.txt" <<'PYEOF'
import re
import sys
from importlib import metadata

from packaging.requirements import Requirement


def norm(name):
    return re.sub(r"[-_.]+", "-", name).lower()


top = {}
for path in sys.argv[1:]:
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if line:
            top[norm(Requirement(line).name)] = "top-level (ci/" + path.rsplit("/", 1)[1] + ")"
top["torch"] = "top-level (ci/setup_env.sh: the CPU wheel, installed first)"
top["horovod"] = "top-level (ci/setup_horovod.sh: built from its sdist with our patch)"
top.update({name: "top-level (ci/setup_env.sh)" for name in ("pip", "setuptools", "wheel")})

dists = {}
for dist in metadata.distributions():
    if dist.read_text("direct_url.json") and '"editable": true' in dist.read_text("direct_url.json"):
        continue   # our own editable packages
    dists[norm(dist.metadata["Name"])] = dist
# Who requires whom, walking down from the top-level packages with the extras actually asked for (an extra's
# requirements count only where some parent asked for that extra: tritonclient[all] pulls aiohttp, uvloop[test] not).
parents = {name: set() for name in dists}
extras_asked = {name: set() for name in dists}
for path in sys.argv[1:]:
    for line in open(path):
        line = line.split("#", 1)[0].strip()
        if line and norm(Requirement(line).name) in extras_asked:
            extras_asked[norm(Requirement(line).name)] |= Requirement(line).extras
queue, seen = [n for n in top if n in dists], {}
while queue:
    name = queue.pop()
    extras = frozenset({""} | extras_asked[name])
    if seen.get(name) == extras:
        continue
    seen[name] = extras
    for spec in dists[name].requires or []:
        req = Requirement(spec)
        child = norm(req.name)
        if child not in dists or (req.marker is not None and not any(req.marker.evaluate({"extra": e})
                                                                      for e in extras)):
            continue
        parents[child].add(dists[name].metadata["Name"])
        extras_asked[child] |= req.extras
        queue.append(child)
for name in sorted(dists, key=lambda n: dists[n].metadata["Name"].lower()):
    dist = dists[name]
    version = dist.version.split("+")[0]
    why = top.get(name) or ("via " + ", ".join(sorted(parents[name], key=str.lower)) if parents[name] else "unused")
    print(f"{dist.metadata['Name']}=={version}  # {why}")
PYEOF
} > "$TMP"
mv "$TMP" "$OUT"
trap - EXIT
echo "wrote $OUT ($(grep -vc '^#' "$OUT") pins) from $VENV"
