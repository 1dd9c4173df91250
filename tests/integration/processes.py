"""Pipeline processes a test starts: their logs kept in files, and shown when a wait times out.

A process's stderr goes to a file, never to a pipe: a pipe nobody reads fills at 64 KiB and then
blocks the process on its next log line, which looks exactly like a pipeline that stopped working.
Every process started here is remembered until it has ended, so a test that times out waiting for
one (`conftest.wait_for`) fails with what each of them logged, not with a bare "timed out".
"""

from __future__ import annotations

import signal
import subprocess
import tempfile
from pathlib import Path

TAIL_CHARS = 4000
_started: dict[int, tuple[subprocess.Popen, Path]] = {}


def spawn(command: list[str], env: dict[str, str]) -> subprocess.Popen:
    """Start `command` with its stdout discarded and its stderr kept in a log file."""
    with tempfile.NamedTemporaryFile(prefix="sv-test-", suffix=".log", delete=False) as log:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=log)
    _started[process.pid] = (process, Path(log.name))
    return process


def log_of(process: subprocess.Popen) -> str:
    """What the process has logged so far (stderr); empty for one not started by `spawn`."""
    entry = _started.get(process.pid)
    return entry[1].read_text(errors="replace") if entry else ""


def stop_process(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 60) -> str:
    """Signal the process (SIGTERM by default), wait for it to end, and return its whole log."""
    if process.poll() is None:
        process.send_signal(sig)
    process.wait(timeout=timeout)
    log = log_of(process)
    forget_ended()
    return log


def forget_ended() -> None:
    """Drop the processes that have ended, with their log files; running ones stay remembered."""
    for pid, (process, log) in list(_started.items()):
        if process.poll() is not None:
            log.unlink(missing_ok=True)
            del _started[pid]


def logs_of_started() -> str:
    """The end of each remembered process's log, with whether it still runs: for a failure message."""
    parts = []
    for process, log in _started.values():
        state = "running" if process.poll() is None else f"exited with {process.returncode}"
        command = " ".join(str(a) for a in process.args[1:])
        text = log.read_text(errors="replace") if log.exists() else ""
        parts.append(f"--- {command} (pid {process.pid}, {state}), last of its log:\n{text[-TAIL_CHARS:]}")
    return "\n".join(parts)
