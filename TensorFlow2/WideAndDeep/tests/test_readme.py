"""README.md is checked against the code: its flag table is the parser's (wide_deep.cli), and the
scripts and files it names exist.

    python tests/test_readme.py --update      # rewrite the table after a flag changed
"""
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
RECIPE_DIR = os.path.dirname(HERE)
README = os.path.join(RECIPE_DIR, "README.md")
BLOCK = re.compile(r"(<!-- parameter_table -->\n)(.*?)(<!-- /parameter_table -->)", re.S)


def _table(text):
    match = BLOCK.search(text)
    assert match, "README.md lacks the <!-- parameter_table --> block"
    return match.group(2)


def update(path=README):
    from wide_deep.cli import parameter_table
    text = BLOCK.sub(lambda m: m.group(1) + parameter_table() + "\n" + m.group(3), open(path).read())
    with open(path, "w") as f:
        f.write(text)


def test_parameter_table_equals_the_parsers():
    from wide_deep.cli import parameter_table
    assert _table(open(README).read()) == parameter_table() + "\n", (
        "README.md's parameter table differs from the parser: run python tests/test_readme.py --update")


def test_every_flag_of_the_parser_is_in_the_table_and_no_other():
    from wide_deep.cli import build_parser
    flags = {a.option_strings[0] for a in build_parser()._actions if a.option_strings and a.dest != "help"}
    documented = set(re.findall(r"^\| [^|]+ \| `(--\w+)`", _table(open(README).read()), flags=re.M))
    assert documented == flags


def test_seed_flags_are_documented_with_the_seeds_defaults():
    table = _table(open(README).read())
    for flag, default in [("--global_batch_size", "131072"), ("--deep_hidden_units", "1024 1024 1024 1024 1024"),
                          ("--linear_learning_rate", "0.02"), ("--deep_learning_rate", "0.00012"),
                          ("--deep_warmup_epochs", "6"), ("--num_epochs", "20"), ("--model_dir",
                                                                                  "/outbrain/checkpoints")]:
        assert re.search(rf"`{flag}`[^|]* \| `{re.escape(default)}` \|", table), flag


def test_files_and_scripts_named_in_the_readme_exist():
    text = open(README).read()
    named = set(re.findall(r"(?<![\w/.])((?:wide_deep|tests|scripts)/[\w/.]+\.(?:py|sh|yaml)|[\w]+\.(?:py|sh))\b",
                           text))
    missing = [p for p in sorted(named) if not os.path.exists(os.path.join(RECIPE_DIR, p))
               and p not in ("hubconf.py",)]
    assert not missing, missing
    for tool in ("quickstart.sh", "gen_csv.py", "transcode.py", "gen_embedding_sizes.py", "Dockerfile",
                 "hvd_wrapper.sh", "requirements.txt"):
        assert tool in text and os.path.exists(os.path.join(RECIPE_DIR, tool)), tool


if __name__ == "__main__" and sys.argv[1:] == ["--update"]:
    sys.path[:0] = [RECIPE_DIR, os.path.join(os.path.dirname(os.path.dirname(RECIPE_DIR)), "common")]
    update()
