"""Talking to supervisord, the process manager that runs and restarts the stack's services.

We use supervisord's own XML-RPC client over its Unix socket rather than parsing `supervisorctl`
output: process states come back as data.
"""

from __future__ import annotations

import http.client
import sys
import time
import xmlrpc.client
from dataclasses import dataclass
from pathlib import Path

from supervisor.xmlrpc import SupervisorTransport

from pipelines.errors import StackError
from stack.settings import StackPaths
from stack.shell import run

RUNNING = "RUNNING"
# States from which a process will not come up again without help.
GAVE_UP = {"FATAL", "EXITED", "STOPPED", "UNKNOWN"}


@dataclass(frozen=True)
class ProcessInfo:
    """One supervised program as supervisord reports it."""

    name: str
    state: str
    pid: int
    uptime_s: int
    description: str


class Supervisor:
    """A handle on the supervisord of one state directory."""

    def __init__(self, paths: StackPaths) -> None:
        self.paths = paths

    @property
    def _rpc(self) -> xmlrpc.client.ServerProxy:
        # A fresh connection per call: the transport cannot recover from a failed request.
        socket = f"unix://{self.paths.run / 'supervisor.sock'}"
        transport = SupervisorTransport(None, None, socket)
        return xmlrpc.client.ServerProxy("http://127.0.0.1", transport=transport).supervisor

    def is_running(self) -> bool:
        """True when supervisord answers on this state directory's socket."""
        try:
            return self._rpc.getState()["statename"] == "RUNNING"
        except (OSError, http.client.HTTPException, xmlrpc.client.Fault):
            return False

    def start_daemon(self) -> None:
        """Launch supervisord in the background and wait until it answers."""
        supervisord = Path(sys.executable).with_name("supervisord")
        run([supervisord, "-c", self.paths.supervisord_conf], step="start supervisord")
        deadline = time.monotonic() + 20
        while not self.is_running():
            if time.monotonic() > deadline:
                raise StackError(f"supervisord did not start; see {self.paths.logs / 'supervisord.log'}")
            time.sleep(0.2)

    def reload_config(self) -> list[str]:
        """Apply a re-rendered configuration: add new programs, restart changed ones, drop removed ones.

        Returns the names of programs whose definition changed (they are left stopped; `up` starts them).
        """
        added, changed, removed = self._rpc.reloadConfig()[0]
        for name in removed + changed:
            self._stop_quietly(name)
            self._rpc.removeProcessGroup(name)
        for name in added + changed:
            self._rpc.addProcessGroup(name)
        return changed

    def processes(self) -> dict[str, ProcessInfo]:
        """Every program's state."""
        return {
            info["name"]: ProcessInfo(
                name=info["name"],
                state=info["statename"],
                pid=info["pid"],
                uptime_s=max(0, info["now"] - info["start"]) if info["pid"] else 0,
                description=info["description"],
            )
            for info in self._rpc.getAllProcessInfo()
        }

    def start(self, name: str) -> None:
        """Start a program unless it is already up; supervisord restarts it if it crashes later."""
        if self.processes()[name].state in {RUNNING, "STARTING"}:
            return
        try:
            self._rpc.startProcess(name, False)
        except xmlrpc.client.Fault as e:
            raise StackError(f"start {name}: supervisord refused: {e.faultString}") from e

    def stop(self, name: str) -> None:
        """Stop one program and wait for it to exit (used by tests that crash and restart services)."""
        self._stop_quietly(name)

    def shutdown(self) -> None:
        """Stop every program in reverse start order, then supervisord itself."""
        for name in reversed(list(self.processes())):
            self._stop_quietly(name)
        self._rpc.shutdown()

    def _stop_quietly(self, name: str) -> None:
        try:
            self._rpc.stopProcess(name, True)
        except xmlrpc.client.Fault as e:
            if "NOT_RUNNING" not in e.faultString:
                raise StackError(f"stop {name}: {e.faultString}") from e
