"""The MLServer process's entry point: ``mlserver start DIR`` with ``triton_extensions`` installed, plus a watchdog that stops the server when the process
that launched it dies without stopping it (SIGKILL, a crashed test run), so no server is left orphaned on a port.

Run as ``python -m recsys_common.serving._mlserver_entry DIR PARENT_PID`` by ``mlserver_launcher`` only.
"""
import os
import shutil
import signal
import sys
import threading
import time


def _watch_parent(parent_pid: int, poll_s: float = 1.0, grace_s: float = 10.0) -> None:
    while os.getppid() == parent_pid:
        time.sleep(poll_s)
    # the launcher is gone (we were re-parented): stop like on Ctrl-C, then for sure
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os._exit(1)


def main(argv=None) -> None:
    folder, parent_pid = (argv if argv is not None else sys.argv[1:])
    threading.Thread(target=_watch_parent, args=(int(parent_pid),), daemon=True).start()
    sys.argv = ["mlserver", "start", folder]
    from .triton_extensions import install
    install(folder)   # Triton's binary tensor extension (HTTP) and ModelConfig (gRPC), which MLServer lacks
    from mlserver.cli.main import main as mlserver_main
    try:
        mlserver_main()
    finally:
        if os.getppid() != int(parent_pid):  # orphaned: nobody else will remove the launcher's temporary settings
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
