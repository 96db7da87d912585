"""One flag, both spellings: ``--server-url`` and ``--server_url`` name the same option.

NVIDIA's tools spell their flags both ways, sometimes within one recipe (the seed's ``evaluate_latency.py`` takes
``--server-url``, its ``evaluate_accuracy.py`` ``--server_url``), and users copy command lines between them. A flag
added through :func:`add_flag` accepts the spelling given and its dash/underscore twin, stored under one ``dest``:

    >>> import argparse
    >>> p = argparse.ArgumentParser()
    >>> _ = add_flag(p, "--server-url", default="127.0.0.1:8001")
    >>> p.parse_args(["--server_url", "h:1"]).server_url
    'h:1'
    >>> spellings("--http-url")
    ['--http-url', '--http_url']

The spelling given first is the one ``--help`` lists first and the one the READMEs use.
"""
from __future__ import annotations

import argparse
from typing import List


def spellings(*names: str) -> List[str]:
    """Each long option of ``names`` followed by its dash/underscore twins (no duplicates, order kept); short
    options (``-f``) as given."""
    out: List[str] = []
    for name in names:
        variants = [name]
        if name.startswith("--"):
            body = name[2:]
            variants += ["--" + body.replace("_", "-"), "--" + body.replace("-", "_")]
        for variant in variants:
            if variant not in out:
                out.append(variant)
    return out


def add_flag(parser, *names: str, **kwargs) -> argparse.Action:
    """``parser.add_argument`` (a parser or an argument group) with every name in both spellings; ``dest`` defaults to
    the first long name with dashes as underscores (``--server-url`` -> ``server_url``)."""
    if "dest" not in kwargs and kwargs.get("action") not in ("help", "version"):
        long_names = [n for n in names if n.startswith("--")]
        if long_names:
            kwargs["dest"] = long_names[0][2:].replace("-", "_")
    return parser.add_argument(*spellings(*names), **kwargs)
