"""One entry contract for every command-line tool: ``main(argv)`` returns its results, :func:`run_main` exits.

A tool's ``main(argv)`` is what tests and other code call: it parses ``argv``, does the work, returns what it made
(a dict, a path, a FeatureSpec) and raises typed errors. It never prints an error line and never calls
``sys.exit``. The command line is one line at the bottom of the file::

    if __name__ == "__main__":
        run_main(main, prog="ncf.py", input_errors=(DatasetError, CheckpointError))

:func:`run_main` turns the outcome into the exit status users and scripts see:

=========================================================  ======  ============================================
outcome                                                    status  stderr
=========================================================  ======  ============================================
``main`` returned                                          0       (``report(result)`` may print a summary)
:class:`InputError`, or a class in ``input_errors``        2       ``prog: error: <message>``
a class in ``failures`` (a diverged loss, a server error)   1       ``prog: error: <message>``
anything else                                              1       the traceback (a bug: show where it is)
``argparse`` / ``SystemExit`` from ``main``                as is   argparse's own usage line
=========================================================  ======  ============================================

Exit status 2 is argparse's for a bad flag; bad input a user can fix (a path, a file's row, a flag's value that
argparse cannot check) is the same kind of mistake and gets the same status. A failure of the run itself (the
loss diverged, a server refused) exits 1.

Example (``python tool.py /nope`` prints ``tool.py: error: /nope: not a directory`` and exits 2)::

    def main(argv=None):
        args = build_parser().parse_args(argv)
        if not os.path.isdir(args.path):
            raise InputError(f"{args.path}: not a directory")
        return {"rows": count_rows(args.path)}

    if __name__ == "__main__":
        run_main(main, report=lambda result: print(result["rows"]))
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, NoReturn, Optional, Sequence, Tuple, Type

ExceptionTypes = Tuple[Type[BaseException], ...]


class InputError(ValueError):
    """Input a user can fix: a flag's value, a missing or malformed file, a row; :func:`run_main` exits 2.

    A ``ValueError``, so code that caught ``ValueError`` for bad input still catches it. Tools' own bad-input
    errors derive from it (or are listed in ``run_main(input_errors=...)``) and name the file, row or field.
    """


class CheckFailedError(RuntimeError):
    """A tool ran to the end and its check did not pass (a served metric off by more than the tolerance).

    ``result`` holds what the tool returns on success, so a caller can still read the figures.
    """

    def __init__(self, message: str, result: Any = None):
        super().__init__(message)
        self.result = result


def error_line(prog: str, error: BaseException, with_type: bool = False) -> str:
    """``prog: error: message`` (``prog: error: ValueError: message`` with ``with_type``)."""
    kind = f"{type(error).__name__}: " if with_type else ""
    return f"{prog}: error: {kind}{error}"


def run_main(main: Callable[[Optional[Sequence[str]]], Any], argv: Optional[Sequence[str]] = None, *,
             prog: Optional[str] = None, input_errors: ExceptionTypes = (), failures: ExceptionTypes = (),
             report: Optional[Callable[[Any], None]] = None, with_type: bool = False,
             hint: Optional[str] = None, hint_errors: ExceptionTypes = ()) -> NoReturn:
    """Run ``main(argv)`` as a command and exit: 0 on success, 2 for bad input, 1 for a failure.

    The arguments are :func:`exit_status`'s.
    """
    sys.exit(exit_status(main, argv, prog=prog, input_errors=input_errors, failures=failures, report=report,
                         with_type=with_type, hint=hint, hint_errors=hint_errors))


def exit_status(main: Callable[[Optional[Sequence[str]]], Any], argv: Optional[Sequence[str]] = None, *,
                prog: Optional[str] = None, input_errors: ExceptionTypes = (), failures: ExceptionTypes = (),
                report: Optional[Callable[[Any], None]] = None, with_type: bool = False,
                hint: Optional[str] = None, hint_errors: ExceptionTypes = ()) -> int:
    """Run ``main(argv)`` as a command; returns the exit status (0, 2 for bad input, 1 for a failure).

    :func:`run_main` exits with it; a script that must do something before exiting (a launcher helper, a test)
    calls this.

    Args:
        main: the tool's ``main(argv)``; called with ``sys.argv[1:]`` when ``argv`` is None.
        prog: the name in the error line (default: the script's file name, as argparse does).
        input_errors: the tool's bad-input error classes besides :class:`InputError` (exit 2).
        failures: the error classes of a run that failed without a bug (exit 1, one line, no traceback).
            :class:`CheckFailedError` is always one.
        report: called with ``main``'s result before exiting 0 (prints a summary on the command line only).
        with_type: put a failure's class name in its line (``error: FloatingPointError: ...``).
        hint: a second line after a bad-input error (``run with --help for the flags``); only after the classes
            in ``hint_errors`` when given (the flag errors, not a bad file).
    """
    prog = prog or os.path.basename(sys.argv[0])
    try:
        result = main(list(sys.argv[1:]) if argv is None else argv)
    except (InputError,) + tuple(input_errors) as error:
        print(error_line(prog, error), file=sys.stderr)   # a sentence about the input: no class name
        if hint and (not hint_errors or isinstance(error, hint_errors)):
            print(hint, file=sys.stderr)
        return 2
    except (CheckFailedError,) + tuple(failures) as error:
        # a failed check's message is a sentence about the result: no class name
        print(error_line(prog, error, with_type and not isinstance(error, CheckFailedError)), file=sys.stderr)
        return 1
    if report is not None:
        report(result)
    return 0
