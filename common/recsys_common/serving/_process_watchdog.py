"""Run a command as a child and stop it when the process that launched us dies, so that no server is left on a port
after a crashed or SIGKILLed test run (``triton_server`` starts ``tritonserver`` through this).

    python -m recsys_common.serving._process_watchdog PARENT_PID GRACE_S -- COMMAND [ARGS...]

We are the leader of a process group of our own (the launcher starts us with ``start_new_session``); the command and
everything it starts (Triton's Python-backend stubs) share the group. Exits with the command's status when it ends
by itself. When PARENT_PID is no longer our parent (we were re-parented: the launcher died) or we get SIGTERM /
SIGINT: SIGTERM to the command, ``GRACE_S`` seconds for it to exit, then SIGKILL to the whole group, ourselves
included. Only the standard library: it starts in a few milliseconds.
"""
import os
import signal
import subprocess
import sys
import time

POLL_S = 0.5


def _stop(child: subprocess.Popen, grace_s: float) -> None:
    if child.poll() is None:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
    # whatever is left in our group (the command's own children), then us
    os.killpg(os.getpgrp(), signal.SIGKILL)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if len(argv) < 4 or argv[2] != "--":
        sys.exit("usage: python -m recsys_common.serving._process_watchdog PARENT_PID GRACE_S -- COMMAND [ARGS...]")
    parent_pid, grace_s, command = int(argv[0]), float(argv[1]), argv[3:]
    stopping = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.append(1))
    child = subprocess.Popen(command)
    while child.poll() is None:
        if stopping or os.getppid() != parent_pid:
            _stop(child, grace_s)
        time.sleep(POLL_S)
    if os.getppid() != parent_pid:   # the command died by itself and nobody is left to clear its children
        os.killpg(os.getpgrp(), signal.SIGKILL)
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
