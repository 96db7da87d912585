"""The READMEs as a user reads them: every shell block runs from a fresh clone, or says at its top why it cannot run
here; every relative link and anchor resolves; every ``python -m`` module, script and ``--flag`` a block names exists.

Conventions for README authors (the top README and ci/README.md say them too):

* a fenced ``bash`` block runs as written, with ``bash -euo pipefail`` in the README's directory, the project's
  ``.venv/bin`` first on ``PATH`` and ``RECSYS_DATA_DIR`` set; it must finish in minutes on 2 cores (use the small
  sizes the recipe documents, e.g. through environment variables with a default: ``${EPOCHS:-1}``). The blocks
  that stand for a user's own data read it from a variable with a default; here they get the samples:
  ``CRITEO_DIR`` (a folder whose ``train.txt`` is 1,999 rows of Criteo's Kaggle file) and ``CLICK_LOG`` (999 rows
  of Avazu's ``train.csv``);
* a block that cannot run here starts with a line ``# not run in CI: <why>`` (a GPU, a cluster, a full-size
  download, a Docker daemon); its commands are still checked for modules, scripts and flags;
* ``console`` / ``text`` blocks are output, not commands.
"""
import ast
import os
import re
import shlex
import subprocess
import sys
from functools import lru_cache

import pytest

from recsys_testing import repo_root, shared_data_dir, shared_data_path

REPO = repo_root()
SKIP_MARK = re.compile(r"^# not run in CI: \S")
FENCE = re.compile(r"^```(\w*)\s*$")
SHELL_LANGUAGES = ("bash", "sh", "shell")
BLOCK_TIMEOUT_S = 900


def readmes():
    """Every README.md the repository ships (not those of vendored or generated folders)."""
    found = []
    for directory, subdirs, files in os.walk(REPO):
        subdirs[:] = [d for d in subdirs if not d.startswith(".") and d not in ("node_modules", "__pycache__")]
        if "README.md" in files:
            found.append(os.path.relpath(os.path.join(directory, "README.md"), REPO))
    return sorted(found)


@lru_cache(maxsize=None)
def shell_blocks(readme: str):
    """``[(line, language, text)]`` of the fenced blocks of ``readme`` in a shell language."""
    blocks, language, start, body = [], None, 0, []
    with open(os.path.join(REPO, readme)) as f:
        for number, line in enumerate(f, start=1):
            match = FENCE.match(line.rstrip("\n"))
            if match and language is None:
                language, start, body = match.group(1) or "text", number, []
            elif line.startswith("```") and language is not None:
                if language in SHELL_LANGUAGES:
                    blocks.append((start, language, "".join(body)))
                language = None
            elif language is not None:
                body.append(line)
    return blocks


def runnable_blocks():
    for readme in readmes():
        for line, _, text in shell_blocks(readme):
            first = next((l for l in text.splitlines() if l.strip()), "")
            if not SKIP_MARK.match(first):
                yield pytest.param(readme, line, text, id=f"{readme}:{line}")


def _commands(text: str):
    """The block's commands, continuation lines joined, comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    for line in joined.splitlines():
        line = line.split(" #", 1)[0].strip()
        if line and not line.startswith("#"):
            yield line


@pytest.fixture(scope="module")
def user_data(tmp_path_factory):
    """The samples standing for a user's own data in the journeys (``CRITEO_DIR``, ``CLICK_LOG``)."""
    criteo = tmp_path_factory.mktemp("criteo")
    os.symlink(shared_data_path("criteo", "kaggle-train-head1999.tsv"), criteo / "train.txt")
    return {"CRITEO_DIR": str(criteo), "CLICK_LOG": shared_data_path("avazu", "avazu-train-head999.csv")}


@pytest.mark.parametrize("readme,line,text", list(runnable_blocks()))
def test_the_block_runs_as_written(readme, line, text, tmp_path, user_data):
    env = dict(os.environ, PATH=os.pathsep.join([os.path.join(REPO, ".venv", "bin"), os.environ.get("PATH", "")]),
               RECSYS_DATA_DIR=shared_data_dir(), HOME=os.environ.get("HOME", str(tmp_path)),
               TMPDIR=str(tmp_path), **user_data)
    result = subprocess.run(["bash", "-euo", "pipefail", "-c", text], cwd=os.path.dirname(os.path.join(REPO, readme)),
                            env=env, capture_output=True, text=True, timeout=BLOCK_TIMEOUT_S)
    assert result.returncode == 0, (f"{readme}:{line}: the block exited {result.returncode}\n--- block\n{text}"
                                    f"--- output (tail)\n{(result.stdout + result.stderr)[-4000:]}")


def test_every_skipped_block_says_why():
    """A block that is not run starts with '# not run in CI: <why>' (checked by SKIP_MARK), so the reader sees why."""
    vague = []
    for readme in readmes():
        for line, _, text in shell_blocks(readme):
            first = next((l for l in text.splitlines() if l.strip()), "")
            if first.lower().startswith("# not run") and not SKIP_MARK.match(first):
                vague.append(f"{readme}:{line}: {first}")
    assert not vague, "blocks skipped without a reason:\n" + "\n".join(vague)


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


@lru_cache(maxsize=None)
def _anchors(path: str):
    with open(path) as f:
        body = f.read()
    body = re.sub(r"^```.*?^```", "", body, flags=re.M | re.S)
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", body, flags=re.M)}


@pytest.mark.parametrize("readme", readmes())
def test_relative_links_and_anchors_resolve(readme):
    with open(os.path.join(REPO, readme)) as f:
        body = re.sub(r"^```.*?^```", "", f.read(), flags=re.M | re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", body):
        if re.match(r"^[a-z]+:", target):
            continue   # http(s), mailto: not checked here (no network in CI)
        path, _, anchor = target.partition("#")
        full = os.path.normpath(os.path.join(REPO, os.path.dirname(readme), path)) if path \
            else os.path.join(REPO, readme)
        if not os.path.exists(full):
            broken.append(f"{target}: {os.path.relpath(full, REPO)} does not exist")
        elif anchor and full.endswith(".md") and anchor not in _anchors(full):
            broken.append(f"{target}: no heading with anchor #{anchor}")
    assert not broken, f"{readme}:\n  " + "\n  ".join(broken)


@lru_cache(maxsize=1)
def known_flags():
    """Every ``--flag`` string literal in the project's Python sources (parsers, add_flag, spellings), both spellings
    (``-`` and ``_`` are interchangeable in our parsers)."""
    flags = set()
    for top in ("common", "PyTorch", "TensorFlow2", "ci"):
        for directory, subdirs, files in os.walk(os.path.join(REPO, top)):
            subdirs[:] = [d for d in subdirs if d not in ("__pycache__",) and not d.startswith(".")]
            for name in files:
                if name.endswith(".py"):
                    with open(os.path.join(directory, name)) as f:
                        for literal in re.findall(r"[\"'](--[A-Za-z][\w-]*)", f.read()):
                            flags.add(literal.replace("-", "_"))
    return flags


def _python_commands(readme: str):
    """``(line, directory, argv)`` of every ``python`` command in the README's shell blocks (run or not), with the
    directory it runs in (each block starts in the README's; ``cd DIR`` moves it, as in the shell)."""
    for line, _, text in shell_blocks(readme):
        block_dir = os.path.dirname(os.path.join(REPO, readme))
        for command in _commands(text):
            subshell = command.startswith("(")   # (cd DIR && ...): the directory change ends with the line
            here = block_dir
            for part in re.split(r"&&|;", command.strip("()")):
                try:
                    words = shlex.split(part.strip().strip("()"))
                except ValueError:
                    continue
                if len(words) == 2 and words[0] == "cd" and "$" not in words[1]:
                    here = os.path.normpath(os.path.join(here, words[1]))
                    continue
                for i, word in enumerate(words):
                    if re.match(r"^(\S*/)?python3?$", word):
                        yield line, here, words[i + 1:]
                        break
            if not subshell:
                block_dir = here


@pytest.mark.parametrize("readme", readmes())
def test_named_modules_scripts_and_flags_exist(readme):
    problems = []
    for line, here, argv in _python_commands(readme):
        if not argv:
            continue
        if not os.path.isdir(here):
            problems.append(f"line {line}: cd {os.path.relpath(here, REPO)}: no such directory")
            continue
        if argv[0] == "-m" and len(argv) > 1:
            module = argv[1]
            if module.split(".")[0] not in ("pytest", "pip", "torch", "venv", "http"):
                found = subprocess.run([sys.executable, "-c", f"import importlib.util, sys; "
                                        f"sys.exit(importlib.util.find_spec({module!r}) is None)"],
                                       cwd=here, capture_output=True)
                if found.returncode != 0:
                    problems.append(f"line {line}: python -m {module}: no such module")
        elif argv[0].endswith(".py") and "$" not in argv[0] and not os.path.exists(os.path.join(here, argv[0])):
            problems.append(f"line {line}: python {argv[0]}: no such script (from {os.path.relpath(here, REPO)})")
        for word in argv[1:]:
            flag = word.split("=", 1)[0]
            if re.match(r"^--[A-Za-z][\w-]*$", flag) and flag.replace("-", "_") not in known_flags():
                problems.append(f"line {line}: {flag}: no parser in the project defines it")
    assert not problems, f"{readme}:\n  " + "\n  ".join(problems)
