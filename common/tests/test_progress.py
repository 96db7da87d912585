"""recsys_common.logger.Progress / check_finite: the one progress line (done of total, rate, time left) and the one
NaN check the tools and training loops use."""
import doctest

import pytest

from recsys_common import checkpoints, logger
from recsys_common.logger import Progress, check_finite


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_progress_line_is_throttled_and_names_done_total_rate_and_time_left():
    clock, lines = Clock(), []
    p = Progress("[tool] pass 2", 4_000_000, every=5.0, out=lines.append, clock=clock)
    clock.now = 1.0
    p.update(1_000_000)
    assert lines == []                                           # before `every` seconds: quiet
    clock.now = 10.0
    p.update(1_000_000)
    assert lines == ["[tool] pass 2: 2,000,000 of 4,000,000 rows (50.0 %), 200,000 rows/s, 0:00:10 left"]
    clock.now = 11.0
    p.update(1_000)
    assert len(lines) == 1                                       # throttled again
    p.update(0, final=True)
    assert len(lines) == 2
    p.set(4_000_000)                                             # the end of an exact total always prints
    assert lines[-1].startswith("[tool] pass 2: 4,000,000 of 4,000,000 rows (100.0 %)")
    assert lines[-1].endswith("0:00:00 left")


def test_estimated_total_scaled_units_and_figures_only():
    clock, lines = Clock(), []
    p = Progress("[x] read", 3 * 2 ** 20, unit="MiB", scale=2 ** 20, digits=1, estimated=True, every=1.0,
                 out=lines.append, clock=clock)
    clock.now = 2.0
    p.set(2 ** 20)
    assert lines == ["[x] read: 1.0 of ~3.0 MiB (33.3 %), 0.5 MiB/s, 0:00:04 left"]
    clock.now = 2.5
    p.set(4 * 2 ** 20)                                           # past an estimate: throttled, not printed each call
    assert len(lines) == 1
    silent = Progress("loop", 100, out=False, clock=clock)       # the training loops: figures, no line
    clock.now = 12.5
    silent.set(20)
    assert (silent.rate(), silent.seconds_left()) == (2.0, 40.0)
    silent.restart(total=10)
    assert silent.done == 0 and silent.seconds_left() == float("inf")


def test_check_finite():
    assert check_finite(1.5, "never formatted {missing}") == 1.5
    with pytest.raises(FloatingPointError, match=r"^loss is inf at step 7$"):
        check_finite(float("inf"), "loss is {value} at step {step}", step=7)
    with pytest.raises(RuntimeError, match="nan"):
        check_finite(float("nan"), "{value}", RuntimeError)


@pytest.mark.parametrize("module", [logger, checkpoints])
def test_docstring_examples(module):
    assert doctest.testmod(module).failed == 0
