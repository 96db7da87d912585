"""The one entry contract (recsys_common.cli.run_main): 0 with a report, 2 for bad input, 1 for a failure."""
import subprocess
import sys

import pytest

from recsys_common.cli import CheckFailedError, InputError, run_main


def _exit(capsys, main, argv, **kwargs):
    with pytest.raises(SystemExit) as info:
        run_main(main, argv, prog="tool.py", **kwargs)
    return info.value.code, capsys.readouterr()


def test_success_reports_the_result_and_exits_0(capsys):
    code, out = _exit(capsys, lambda argv: {"rows": len(argv)}, ["a", "b"], report=lambda r: print(r["rows"]))
    assert code == 0 and out.out == "2\n" and out.err == ""


def test_bad_input_exits_2_with_one_named_line(capsys):
    def main(argv):
        raise InputError("spec.yaml: feature cat_3 has no cardinality")
    code, out = _exit(capsys, main, [], hint="run with --help for the flags")
    assert code == 2
    assert out.err == "tool.py: error: spec.yaml: feature cat_3 has no cardinality\nrun with --help for the flags\n"


def test_a_tools_own_input_errors_exit_2_and_failures_exit_1(capsys):
    class SpecError(ValueError):
        pass

    class FlagError(ValueError):
        pass

    def bad_input(argv):
        raise SpecError("x.yaml: missing")

    def diverged(argv):
        raise FloatingPointError("the loss is nan at step 3")
    code, out = _exit(capsys, bad_input, [], input_errors=(FlagError, SpecError), hint="see --help",
                      hint_errors=(FlagError,))
    assert code == 2 and out.err == "tool.py: error: x.yaml: missing\n"   # the hint is for flag errors only
    code, out = _exit(capsys, diverged, [], failures=(FloatingPointError,), with_type=True)
    assert code == 1 and out.err == "tool.py: error: FloatingPointError: the loss is nan at step 3\n"


def test_a_failed_check_exits_1_and_keeps_its_result(capsys):
    def main(argv):
        raise CheckFailedError("AUC differs by 0.02 > --tolerance 0.001", result={"auc": 0.7})
    code, out = _exit(capsys, main, [])
    assert code == 1 and "tool.py: error: AUC differs" in out.err


def test_an_unlisted_error_is_a_bug_and_keeps_its_traceback():
    # Not caught: the traceback shows where the bug is (a one-line message would hide it).
    def main(argv):
        raise KeyError("oops")
    with pytest.raises(KeyError):
        run_main(main, [], prog="tool.py")


def test_argv_defaults_to_the_command_line():
    code = ("import sys; from recsys_common.cli import run_main, InputError\n"
            "def main(argv):\n"
            "    raise InputError('got ' + ' '.join(argv))\n"
            "run_main(main)\n")
    proc = subprocess.run([sys.executable, "-c", code, "--x", "1"], capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr == "-c: error: got --x 1\n"
