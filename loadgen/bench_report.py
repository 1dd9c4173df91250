"""What the benchmarks' printed reports share: figures that survive a failed step, and the machine line.

- `Results`: figures by key, with a note ("failed: ...", "(pending)") where a step has none, and the
  ratios and PASS/MISS verdicts between them, so one failure never hides the other figures;
- `machine_line`: what a report's figures were measured on (cores, PostgreSQL settings, commit).
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from loadgen import seed_baselines as seed
from pipelines.logs import get_logger
from pipelines.settings import PostgresSettings

log = get_logger("loadgen.bench_report")

REPO_ROOT = Path(__file__).resolve().parents[1]


class Results:
    """Figures by key, with "(pending)" for hooks and "failed" for errors, so one failure never hides the rest."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.notes: dict[str, str] = {}

    def measure(self, key: str, fn: Callable[[], Any]) -> Any:
        """Run one measurement; record its figure, or why there is none."""
        started = time.monotonic()
        log.info("measuring", step=key)
        try:
            value = fn()
        except NotImplementedError:
            self.notes[key] = "(pending)"
            return None
        except Exception as e:
            log.exception("measurement failed", step=key)
            self.notes[key] = f"failed: {str(e).splitlines()[0][:60] if str(e) else type(e).__name__}"
            return None
        log.info("measured", step=key, value=value, seconds=round(time.monotonic() - started, 1))
        if isinstance(value, int | float):
            self.values[key] = float(value)
        return value

    def show(self, key: str) -> str:
        """A figure as printed: thousands separated, or its note."""
        if key in self.values:
            return f"{self.values[key]:,.0f}"
        return self.notes.get(key, "(not run)")

    def ratio(self, numerator: str, denominator: str) -> str:
        """`a / b` as `12.3x`, or "(pending)" when either side is missing."""
        if numerator in self.values and self.values.get(denominator):
            return f"{self.values[numerator] / self.values[denominator]:.2f}x"
        return "(pending)"

    def verdict(self, numerator: str, denominator: str, target: float) -> str:
        """The target of `a / b` and PASS/MISS, or "(pending)" when either side is missing."""
        if numerator in self.values and self.values.get(denominator):
            met = self.values[numerator] / self.values[denominator] >= target
            return f">= {target:g}x  {'PASS' if met else 'MISS'}"
        return f">= {target:g}x  (pending)"


def source_commit() -> str:
    """The checked-out commit, with `+ uncommitted changes` when the work tree differs; `unknown` outside git."""
    git = ["git", "-C", str(REPO_ROOT)]
    try:
        head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True)
        status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head.stdout.strip() + (" + uncommitted changes" if status.stdout.strip() else "")


def machine_line(postgres: PostgresSettings | None = None) -> str:
    """What a report's figures were measured on: cores, the PostgreSQL settings that shape writes, the commit."""
    facts = seed.postgres_facts(postgres)
    return (
        f"{os.cpu_count()} cores; PostgreSQL {facts.get('server_version')},"
        f" synchronous_commit={facts.get('synchronous_commit')}, shared_buffers={facts.get('shared_buffers')};"
        f" commit {source_commit()}"
    )
