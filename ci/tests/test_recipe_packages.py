"""Each recipe is an installable package (its pyproject.toml) that ci/setup_env.sh installs editable, so nothing
edits sys.path; NVIDIA's commands (python dlrm.py / main.py / ncf.py) are shims that still run from the recipe
directory without the install."""
import os
import re
import subprocess
import sys
import tomllib

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# recipe directory -> a module its pyproject.toml installs
RECIPES = {"PyTorch/DLRM": "dlrm", "PyTorch/NCF": "neumf", "TensorFlow2/DLRM_DCNv2": "dlrm_dcnv2",
           "TensorFlow2/WideAndDeep": "wide_deep"}
SHIMS = ["PyTorch/NCF/ncf.py", "PyTorch/NCF/convert.py", "PyTorch/NCF/recommend.py", "PyTorch/NCF/synthetic.py",
         "PyTorch/NCF/deployment/deployer.py", "TensorFlow2/DLRM_DCNv2/dlrm.py", "TensorFlow2/DLRM_DCNv2/dcnv2.py", "TensorFlow2/DLRM_DCNv2/main.py",
         "TensorFlow2/WideAndDeep/main.py", "TensorFlow2/WideAndDeep/predict.py",
         "TensorFlow2/WideAndDeep/triton/export_model.py", "TensorFlow2/WideAndDeep/triton/evaluate_accuracy.py",
         "TensorFlow2/WideAndDeep/triton/evaluate_latency.py"]


def test_setup_installs_common_and_every_recipe_editable():
    text = open(os.path.join(REPO, "ci", "setup_env.sh")).read()
    projects = re.search(r"^PROJECTS=\((.*)\)$", text, re.M).group(1).split()
    assert set(projects) == {"common", *RECIPES}
    assert re.search(r'pip_install --no-deps --no-build-isolation "\$\{EDITABLE\[@\]\}"', text)
    for recipe, module in RECIPES.items():
        with open(os.path.join(REPO, recipe, "pyproject.toml"), "rb") as f:
            config = tomllib.load(f)
        assert "recsys-common" in config["project"]["dependencies"], recipe
        tool = config["tool"]["setuptools"]
        named = tool.get("py-modules", []) + tool.get("packages", {}).get("find", {}).get("include", [])
        assert any(n.rstrip("*") == module for n in named), (recipe, named)


def test_recipe_modules_import_from_any_directory(tmp_path):
    """What the venv of `make setup` gives: no PYTHONPATH, another working directory."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import sys, importlib; print('\\n'.join(importlib.import_module(m).__file__ for m in sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, *RECIPES.values()], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    if proc.returncode and "No module named" in proc.stderr:
        pytest.fail(f"a recipe is not installed (run `make setup`, which installs them editable): {proc.stderr}")
    files = proc.stdout.split()
    for (recipe, _), path in zip(RECIPES.items(), files):
        assert path.startswith(os.path.join(REPO, recipe) + os.sep), (recipe, path)


@pytest.mark.parametrize("shim", SHIMS)
def test_entry_shims_are_a_few_lines_without_sys_path_edits(shim):
    text = open(os.path.join(REPO, shim)).read()
    assert "sys.path" not in text
    code = [line for line in re.sub(r'^""".*?"""', "", text, flags=re.S).splitlines() if line.strip()]
    assert len(code) <= 4, code   # import(s), the main guard, the call


# The recipes' editable import hooks removed (recsys_common's kept: the shared library is installed either way).
BLOCK_EDITABLE = ("import runpy, sys\n"
                  "hooks = [f for f in sys.meta_path if '__editable__' in getattr(f, '__module__', '')\n"
                  "         and 'recsys_common' not in f.__module__]\n"
                  "assert hooks, 'no editable import hook of a recipe to remove'\n"
                  "sys.meta_path[:] = [f for f in sys.meta_path if f not in hooks]\n"
                  "script = sys.argv[1]; sys.argv = sys.argv[1:]\n"
                  "sys.path.insert(0, '.')  # what `python script.py` puts first: the script's directory\n"
                  "runpy.run_path(script, run_name='__main__')\n")


@pytest.mark.parametrize("recipe, command, expected", [
    ("TensorFlow2/DLRM_DCNv2", ["dlrm.py", "--help"], "--dataset_path"),
    ("PyTorch/NCF", ["ncf.py", "--help"], "--data"),
])
def test_nvidia_commands_run_from_the_recipe_without_the_install(recipe, command, expected):
    """The editable installs' import hooks removed: the recipe's own directory is enough, as for NVIDIA's users."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    proc = subprocess.run([sys.executable, "-c", BLOCK_EDITABLE, *command], cwd=os.path.join(REPO, recipe),
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert expected in proc.stdout
