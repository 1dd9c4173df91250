"""One benchmark as a child process, watched: its steps and drains shown live, its failure put in one line.

A benchmark runs as `python -m <module>` in a session of its own, with JSON logs on stderr
(`LOG_FORMAT=json`) and drain progress lines every second (`--progress 1`, see
`loadgen.common.drain.DrainProgress`). Its stdout (the printed report) goes to `<name>.txt` and its stderr
to `<name>.log` in the results folder, so tracebacks are kept for whoever looks and never shown to
the user: a failure is reduced to one reason (`failure_reason`).

`Display` shows what the child is doing: on a terminal, one status line rewritten in place (elapsed
time, the current step, a drain's percentage and rate); otherwise plain lines, a drain's at most
every `PLAIN_DRAIN_EVERY_S`. Finished steps get a line of their own either way.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import orjson

from loadgen.common.processes import stack_env
from loadgen.common.report import REPO_ROOT

PLAIN_DRAIN_EVERY_S = 10.0  # drain lines when the output is not a terminal
STOP_GRACE_S = 60.0  # after SIGTERM (its cleanup: throwaway topics, schemas, child pipelines), then SIGKILL
_QUALIFIED = re.compile(r"\b(?:[a-z_]\w*\.)+([A-Z]\w*(?:Error|Exception))")  # psycopg.errors.X -> X
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)(: .*)?$")  # a traceback's last line


@dataclass
class Outcome:
    """How one benchmark ended: ok, failed with a reason, or skipped; how long; where its output is."""

    name: str
    status: str  # "ok", "failed", "skipped"
    reason: str | None = None
    seconds: float = 0.0
    exit_code: int | None = None
    steps: list[tuple[str, float]] = field(default_factory=list)  # finished steps and their seconds


def mmss(seconds: float) -> str:
    """Seconds as m:ss (h:mm:ss past an hour)."""
    s = round(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


class Display:
    """Progress of the suite on `out`: a status line rewritten in place on a terminal, plain lines otherwise."""

    def __init__(
        self, out: IO[str] | None = None, *, tty: bool | None = None, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.out, self.clock = out or sys.stdout, clock
        self.tty = self.out.isatty() if tty is None else tty
        self.name, self.started, self.step, self.last, self.drain = "", 0.0, "", "", ""
        self._plain_drain_at = 0.0

    def _line(self, text: str) -> None:
        if self.tty:
            self.out.write("\r\x1b[K")
        self.out.write(text + "\n")
        self.out.flush()

    def begin(self, position: str, name: str, command: str) -> None:
        """A benchmark starts."""
        self.name, self.started, self.step, self.last, self.drain = name, self.clock(), "", "starting", ""
        self._plain_drain_at = self.started
        self._line(f"{position} {name}: {command}")

    def record(self, rec: Mapping[str, Any]) -> None:
        """A log record of the child: a step starting or ending, a drain's progress."""
        event = str(rec.get("event", ""))
        if event == "measuring":
            self.step, self.last, self.drain = str(rec.get("step", "")), "", ""
            self._plain_drain_at = self.clock()  # a drain line only once a step has lasted a while
        elif event == "measured":
            self._line(f"    {rec.get('step')}: done in {rec.get('seconds', '?')} s")
            self.drain = ""
        elif event == "measurement failed":
            self._line(f"    {rec.get('step')}: failed (see the log)")
            self.drain = ""
        elif event == "drain progress":
            total = rec.get("total") or 0
            done = rec.get("done") or 0
            share = f"{100 * done / total:.0f}% of {total:,}" if total else f"{done:,}"
            self.drain = f"{rec.get('what')} {share}, {rec.get('rate', 0):,}/s"
            if not self.tty and self.clock() - self._plain_drain_at >= PLAIN_DRAIN_EVERY_S:
                self._plain_drain_at = self.clock()
                self._line(f"    {mmss(self.clock() - self.started)} draining {self.drain}")
        elif event:
            self.last, self.drain = event[:60], ""  # benchmarks without named steps still show what they are at
        self.refresh()

    def refresh(self) -> None:
        """Rewrite the status line (terminal only)."""
        if not self.tty or not self.name:
            return
        parts = [f"  {self.name} {mmss(self.clock() - self.started)}", self.step, self.last, self.drain]
        self.out.write("\r\x1b[K" + " · ".join(p for p in parts if p)[:160])
        self.out.flush()

    def end(self, outcome: Outcome) -> None:
        """A benchmark ended."""
        verdict = "ok" if outcome.status == "ok" else f"{outcome.status}: {outcome.reason}"
        self._line(f"  {outcome.name}: {verdict} ({mmss(outcome.seconds)})")
        self.name = ""


def with_stack_env(env: Mapping[str, str]) -> dict[str, str]:
    """`env` plus the local stack's client settings (`.state/stack.env`) for variables it does not set.

    So `python -m loadgen.suite` works without sourcing the file first, as `make bench` does.
    """
    return stack_env() | dict(env)


def child_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a benchmark: ours, the stack's client settings where unset, JSON logs."""
    env = with_stack_env(os.environ) | {"LOG_FORMAT": "json", "PYTHONUNBUFFERED": "1"}
    return env | dict(extra or {})


def failure_reason(stderr_lines: Iterable[str], exit_code: int | None) -> str:
    """One line saying why a benchmark failed, from its stderr: the exception, else the first error logged.

    The first, because errors logged later are mostly consequences (a cleanup that could not finish).
    """
    exception, logged = None, None
    for line in stderr_lines:
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(orjson.JSONDecodeError):
                rec = orjson.loads(line)
                if isinstance(rec, dict) and rec.get("level") in {"error", "critical"} and logged is None:
                    detail = str(rec.get("exception", "")).strip().splitlines()
                    logged = f"{rec.get('event')}: {detail[-1]}" if detail else str(rec.get("event"))
            continue
        match = _EXCEPTION_LINE.match(line)
        if match:
            exception = line
    reason = _QUALIFIED.sub(r"\1", exception or logged or f"exit code {exit_code}")
    return reason if len(reason) <= 300 else reason[:297] + "..."


def _pump(stream: IO[bytes], log: IO[bytes], lines: queue.Queue[str | None]) -> None:
    """Copy the child's stderr to its log file, and hand each line to the watcher."""
    for raw in stream:
        log.write(raw)
        log.flush()
        lines.put(raw.decode(errors="replace"))
    lines.put(None)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the benchmark, then SIGKILL its whole session if it lingers.

    Every benchmark turns SIGTERM into KeyboardInterrupt and cleans up (loadgen.common.cli). SIGTERM,
    not SIGINT: a child of a process started in the background inherits SIGINT ignored, and then
    waited out the whole grace period (a test of this function took 61 s in CI).
    """
    with contextlib.suppress(ProcessLookupError):
        os.kill(process.pid, signal.SIGTERM)
    try:
        process.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def run_child(
    name: str, argv: list[str], *, results: Path, display: Display, timeout: float, env: Mapping[str, str]
) -> Outcome:
    """Run `argv` (a `python -m ...` command) to its end or `timeout`, showing its progress; its Outcome.

    The child has a session of its own, so a Ctrl-C at the terminal reaches only this process, which
    passes it on (as SIGTERM, `_stop`) and waits for the benchmark's cleanup before re-raising.
    """
    started = time.monotonic()
    results.mkdir(parents=True, exist_ok=True)
    lines: queue.Queue[str | None] = queue.Queue()
    stderr_tail: list[str] = []
    outcome = Outcome(name, "failed")
    with (results / f"{name}.txt").open("wb") as stdout, (results / f"{name}.log").open("wb") as log:
        process = subprocess.Popen(
            argv, stdout=stdout, stderr=subprocess.PIPE, env=dict(env), cwd=REPO_ROOT, start_new_session=True
        )
        assert process.stderr is not None
        pump = threading.Thread(target=_pump, args=(process.stderr, log, lines), daemon=True)
        pump.start()
        timed_out = False
        try:
            while True:
                try:
                    line = lines.get(timeout=0.5)
                except queue.Empty:
                    display.refresh()
                    if time.monotonic() - started > timeout:
                        timed_out = True
                        _stop(process)
                        break
                    continue
                if line is None:
                    break
                stderr_tail = [*stderr_tail[-400:], line]
                if line.startswith("{"):
                    with contextlib.suppress(orjson.JSONDecodeError):
                        rec = orjson.loads(line)
                        if isinstance(rec, dict):
                            display.record(rec)
                            if rec.get("event") == "measured":
                                outcome.steps.append((str(rec.get("step")), float(rec.get("seconds") or 0)))
        except KeyboardInterrupt:
            _stop(process)
            raise
        process.wait()
        pump.join(5)
    outcome.seconds = time.monotonic() - started
    outcome.exit_code = process.returncode
    if timed_out:
        outcome.reason = f"timed out after {mmss(timeout)}"
    elif process.returncode == 0:
        outcome.status = "ok"
    else:
        outcome.reason = failure_reason(stderr_tail, process.returncode)
    return outcome
