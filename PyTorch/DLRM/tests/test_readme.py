"""The README's parameter table is checked against the real parser, so the two never drift."""
import os
import re

from dlrm.cli import FLAGS

README = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
ROW = re.compile(r"^\| `--(\w+)` \| `([^`]*)` \|")


def _default_text(value):
    if isinstance(value, list):
        return ",".join(value) if len(set(value)) > 1 or len(value) < 4 else f"{len(value)} x {value[0]}"
    return str(value)


def test_parameter_table_matches_parser():
    with open(README) as f:
        rows = dict(m.groups() for m in map(ROW.match, f) if m)
    flags = {name: flag for name, flag in FLAGS._flags().items() if name == flag.name}
    assert set(rows) == set(flags), (f"in README only: {sorted(set(rows) - set(flags))}; "
                                     f"in parser only: {sorted(set(flags) - set(rows))}")
    for name, default in rows.items():
        assert default == _default_text(flags[name].default), name


def test_quickstart_command_is_in_readme():
    text = open(README).read()
    assert "bash quickstart.sh" in text
