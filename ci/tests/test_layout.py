"""The one layout every recipe shares (issue 29): each README's map names paths that exist, every recipe answers
"where is X" at the same relative path, no function outside tests runs past a screen, and imports point only down."""
import ast
import os
import re

import pytest

from recsys_testing import repo_root

REPO = repo_root()
RECIPES = {"PyTorch/DLRM": "dlrm", "PyTorch/NCF": "neumf", "TensorFlow2/DLRM_DCNv2": "dlrm_dcnv2",
           "TensorFlow2/WideAndDeep": "wide_deep"}
# The answer to each of a newcomer's questions, relative to the recipe (PKG: the recipe's package).
SAME_PLACE = {"flags -> config": "PKG/cli.py", "training loop": "PKG/train.py", "checkpoints": "PKG/checkpointing.py",
              "Triton repository": "PKG/serving.py", "data": "PKG/data", "preprocessing": "preproc/prepare_dataset.sh",
              "deploy command": "deployment/deploy.py", "benchmarks": "benchmarks"}
MAX_FUNCTION_LINES = 80


def _section(readme: str, title: str) -> str:
    """The text of ``## title`` up to the next ``## `` heading ('' when absent)."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", readme, flags=re.M | re.S)
    return match.group(1) if match else ""


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_the_readme_map_names_paths_that_exist(recipe):
    with open(os.path.join(REPO, recipe, "README.md")) as f:
        readme = f.read()
    where = _section(readme, "Where things are")
    assert where, f"{recipe}/README.md has no '## Where things are' section"
    paths = [p for p in re.findall(r"`([^`\s]+)`", where) if "/" in p or p.endswith((".py", ".sh"))]
    assert len(paths) >= 8, f"{recipe}/README.md: the map names only {paths}"
    missing = [p for p in paths if not os.path.exists(os.path.join(REPO, recipe, p.rstrip("/")))]
    assert not missing, f"{recipe}/README.md 'Where things are' names paths that do not exist: {missing}"
    headings = re.findall(r"^## (.+)$", readme, flags=re.M)
    assert headings.index("Where things are") <= 1, f"{recipe}: the map comes right after the quick start: {headings}"


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_each_question_has_the_same_answer_in_every_recipe(recipe):
    package = RECIPES[recipe]
    missing = {question: where.replace("PKG", package) for question, where in SAME_PLACE.items()
               if not os.path.exists(os.path.join(REPO, recipe, where.replace("PKG", package)))}
    assert not missing, f"{recipe}: not at the shared place: {missing}"
    assert os.path.isdir(os.path.join(REPO, recipe, package, "model")) or \
        os.path.isfile(os.path.join(REPO, recipe, package, "model.py")), f"{recipe}: no {package}/model"


def _python_files(root: str):
    for directory, subdirs, files in os.walk(root):
        subdirs[:] = [d for d in subdirs if d not in ("tests", "__pycache__") and not d.startswith(".")]
        for name in files:
            if name.endswith(".py"):
                yield os.path.join(directory, name)


def _is_parser_builder(node: ast.FunctionDef) -> bool:
    """Argument-parser builders are allowed to be long: one ``add_argument`` per flag is their whole content."""
    calls = [n for n in ast.walk(node) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)]
    flag_calls = [c for c in calls if c.func.attr in ("add_argument", "add_flag", "add_argument_group")
                  or c.func.attr.startswith("DEFINE")]   # argparse, recsys_common.flags, absl
    return len(flag_calls) >= 0.5 * max(len(calls), 1) or len(flag_calls) >= 20


def test_no_function_outside_tests_is_longer_than_a_screen():
    long = []
    for top in (*RECIPES, "common"):
        for path in _python_files(os.path.join(REPO, top)):
            with open(path) as f:
                tree = ast.parse(f.read(), filename=path)
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES and not _is_parser_builder(node):
                        long.append(f"{os.path.relpath(path, REPO)}:{node.lineno} {node.name} ({lines} lines)")
    assert not long, "functions over %d lines:\n  %s" % (MAX_FUNCTION_LINES, "\n  ".join(sorted(long)))


def _imports(path: str):
    with open(path) as f:
        tree = ast.parse(f.read(), filename=path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_the_package_imports_only_downward(recipe):
    """The installed package never imports the recipe's commands, benchmarks or tests, nor another recipe."""
    package = RECIPES[recipe]
    others = {p for r, p in RECIPES.items() if r != recipe}
    upward = []
    for path in _python_files(os.path.join(REPO, recipe, package)):
        for module in _imports(path):
            top = module.split(".")[0]
            if top in ("deployment", "benchmarks", "tests", "triton") or top in others:
                upward.append(f"{os.path.relpath(path, REPO)} imports {module}")
    assert not upward, "\n".join(upward)


def test_the_shared_library_has_no_import_cycle():
    """recsys_common's modules form no cycle (a module importing another that imports it back)."""
    root = os.path.join(REPO, "common", "recsys_common")
    graph = {}
    for path in _python_files(root):
        module = "recsys_common." + os.path.relpath(path, root)[:-3].replace(os.sep, ".").replace(".__init__", "")
        package = module if path.endswith("__init__.py") else module.rsplit(".", 1)[0]
        targets = set()
        with open(path) as f:
            tree = ast.parse(f.read(), filename=path)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
                name = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module
                if name and name.startswith("recsys_common"):
                    targets.add(name)
                    targets.update(f"{name}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name.startswith("recsys_common"))
        graph[module] = targets
    modules = set(graph)
    edges = {m: {t for t in ts if t in modules and t != m} for m, ts in graph.items()}
    cycles = [(a, b) for a in edges for b in edges[a] if a in edges.get(b, ()) and a < b
              and not (a == b.rsplit(".", 1)[0] or b == a.rsplit(".", 1)[0])]   # a package and its own modules
    assert not cycles, f"import cycles in recsys_common: {cycles}"
