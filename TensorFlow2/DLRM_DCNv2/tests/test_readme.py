"""README.md is checked against the code: the parameter tables are the parser's (dlrm_dcnv2.cli.parameter_table),
and the commands and files it names exist.

    python tests/test_readme.py --update      # rewrite the tables after a flag changed
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE_DIR = os.path.dirname(HERE)
REPO_ROOT = os.path.dirname(os.path.dirname(RECIPE_DIR))
README = os.path.join(RECIPE_DIR, "README.md")
MODELS = ("dlrm", "dcnv2")


def _block(model):
    return re.compile(rf"(<!-- parameter_table:{model} -->\n)(.*?)(<!-- /parameter_table:{model} -->)", re.S)


def readme_tables(text):
    out = {}
    for model in MODELS:
        match = _block(model).search(text)
        assert match, f"README.md lacks the <!-- parameter_table:{model} --> block"
        out[model] = match.group(2)
    return out


def update(path=README):
    from dlrm_dcnv2.cli import parameter_table
    text = open(path).read()
    for model in MODELS:
        table = parameter_table(model)
        text = _block(model).sub(lambda m: m.group(1) + table + m.group(3), text)
    with open(path, "w") as f:
        f.write(text)


def test_parameter_tables_equal_the_parsers():
    from dlrm_dcnv2.cli import parameter_table
    tables = readme_tables(open(README).read())
    for model in MODELS:
        assert tables[model] == parameter_table(model), (
            f"README.md's {model} parameter table differs from the parser: run python tests/test_readme.py --update")


def test_every_flag_of_the_parser_is_in_the_readme_and_no_other():
    from dlrm_dcnv2.cli import build_parser
    tables = readme_tables(open(README).read())
    for model in MODELS:
        listed = re.findall(r"^\| `(--\w+)` \|", tables[model], re.M)
        flags = [a.option_strings[0] for a in build_parser(model)._actions
                 if a.option_strings and a.dest != "help" and a.help != "==SUPPRESS=="]
        assert listed == flags


def test_commands_and_paths_named_in_the_readme_exist():
    text = open(README).read()
    assert "bash quickstart.sh" in text and "make quickstart-dlrm-dcnv2" in text
    for module in set(re.findall(r"python -m (dlrm_dcnv2[\w.]+|recsys_common[\w.]+)", text)):
        base = RECIPE_DIR if module.startswith("dlrm_dcnv2") else os.path.join(REPO_ROOT, "common")
        assert os.path.isfile(os.path.join(base, *module.split(".")) + ".py"), module
    for path in ("quickstart.sh", "slurm_multinode.sh", "Dockerfile", "requirements.txt", "preproc/prepare_dataset.sh",
                 "tests/transcoding/small_csv.yaml", "dlrm.py", "dcnv2.py", "main.py"):
        assert path in text and os.path.exists(os.path.join(RECIPE_DIR, path)), path
    for link in re.findall(r"\]\((\.\./[^)#]+)\)", text):
        assert os.path.exists(os.path.join(RECIPE_DIR, link)), link
    # the seed's A100 figures sit next to the statement that no TensorFlow GPU figure could be taken here
    assert "no TensorFlow and no network" in text
    for figure in ("2.84M", "4.55M", "0.689M", "1.37M"):
        assert figure in text


def test_quickstart_is_in_the_makefile():
    makefile = open(os.path.join(REPO_ROOT, "Makefile")).read()
    assert re.search(r"^QUICKSTART \?=.*\n?.*bash TensorFlow2/DLRM_DCNv2/quickstart\.sh", makefile, re.M)
    assert "quickstart-dlrm-dcnv2: setup\n\tbash TensorFlow2/DLRM_DCNv2/quickstart.sh" in makefile


if __name__ == "__main__":
    if sys.argv[1:] != ["--update"]:
        sys.exit(__doc__)
    for path in (RECIPE_DIR, os.path.join(REPO_ROOT, "common")):
        sys.path.insert(0, path)
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    update()
    print(f"updated the parameter tables of {README}")
