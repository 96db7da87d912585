"""Finding the processes a test's Triton server left (or did not leave) behind, from /proc."""
import os
from typing import List


def tritonserver_processes(needle: str) -> List[int]:
    """Pids of running ``tritonserver`` processes whose command line contains ``needle`` (a repository path, a
    ``--http-port=N`` flag); zombies count as gone."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                command = f.read().split(b"\0")
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if command and command[0].endswith(b"/tritonserver") and state != "Z" and \
                any(needle.encode() in part for part in command[1:]):
            found.append(int(entry))
    return found


def servers_of(repo_dir: str) -> List[int]:
    """Pids of the tritonserver processes serving ``repo_dir``."""
    return tritonserver_processes(f"--model-repository={os.path.abspath(repo_dir)}")


def group_alive(pgid: int) -> bool:
    """Whether a live process (not a zombie) of process group ``pgid`` remains: the launcher's watchdog, the server,
    its stubs. (A zombie, e.g. a stub whose server was SIGKILLed before reaping it, waits for init to reap it.)"""
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":   # fields: state, ppid, pgrp, ...
            return True
    return False
