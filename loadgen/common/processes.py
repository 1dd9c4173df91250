"""The service processes a benchmark starts (stream runners, the puller), their environment and their logs.

- `pipeline_env`: the environment of a pipeline process, as a given role, with JSON logs and its
  default batch settings;
- `ServiceProcess`: one `python -m <module>` process, its log in a file, stopped with SIGTERM;
- `PipelineWorkers`: several stream runners (`PipelineProcess`) in one consumer group on a bench
  stream, measured as one pipeline: their partitions, CPU roles, totals and warnings from their logs;
- `backend_pids`: a process's PostgreSQL backends, found by its sessions' application name;
- `find_pid`: a process found by an argument of its command line (the Kafka and Elasticsearch JVMs).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import orjson
import psycopg

from loadgen.common.errors import BenchmarkError
from pipelines.logs import get_logger
from pipelines.settings import ROLE_WRITER, KafkaSettings, PostgresSettings

log = get_logger("loadgen.common.processes")

PIPELINE_APPLICATION = "streamviews-bench-pipeline"  # its sessions' application_name
STOP_TIMEOUT_S = 60.0


def stack_env() -> dict[str, str]:
    """The local stack's client settings (`.state/stack.env`): none when the file or the stack package is not there."""
    try:
        from stack.settings import StackSettings
    except ImportError:
        return {}
    path = StackSettings().paths.env_file
    lines = path.read_text().splitlines() if path.is_file() else []
    pairs = (line.partition("=") for line in lines if not line.lstrip().startswith("#"))
    return {name.strip(): value.strip() for name, sep, value in pairs if sep}


def pipeline_env(
    postgres: PostgresSettings,
    kafka: KafkaSettings,
    *,
    role: str = ROLE_WRITER,
    application_name: str = PIPELINE_APPLICATION,
) -> dict[str, str]:
    """Environment of a pipeline process: ours and stack.env's, as `role`, JSON logs, default batches.

    `PIPELINE_*` variables are left out so the pipeline runs with its default batch settings, and the
    Kafka and PostgreSQL endpoints are the ones this benchmark uses. `application_name` names its
    PostgreSQL sessions (see `backend_pids`).
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIPELINE_") and k not in {"PGPASSWORD", "PGUSER"}}
    env.update(stack_env())
    env.update(
        {
            "PGHOST": postgres.host,
            "PGPORT": str(postgres.port),
            "PGDATABASE": postgres.database,
            "PGUSER": role,
            "PGAPPNAME": application_name,
            "KAFKA_BOOTSTRAP_SERVERS": kafka.bootstrap_servers,
            "LOG_FORMAT": "json",
            # No metrics endpoint: several workers would contend for one port. Their metrics are
            # still kept (the cost is measured), just not served.
            "METRICS_PORT": "0",
        }
    )
    if postgres.secrets_dir is not None:
        env["SECRETS_DIR"] = str(postgres.secrets_dir)
    password = postgres.role_password(role)
    if password is not None:
        env["PGPASSWORD"] = password.get_secret_value()
    return env


def backend_pids(conn: psycopg.Connection, application_name: str) -> tuple[int, ...]:
    """The PostgreSQL backends of the sessions with this application name (a runner has two: batches, catalog)."""
    rows = conn.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application_name,))
    return tuple(pid for (pid,) in rows)


def find_pid(argument: bytes) -> int | None:
    """The first process with `argument` as one of its command-line arguments (a JVM's main class)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if argument + b"\0" in (entry / "cmdline").read_bytes():
                    return int(entry.name)
    return None


class ServiceProcess:
    """One `python -m <module> [args]` service process (a pipeline, the puller), its log in a file."""

    def __init__(self, name: str, module: str, args: Sequence[str], *, env: dict[str, str], log_path: Path) -> None:
        self.name, self.log_path = name, log_path
        self.backend: tuple[int, ...] = ()  # its PostgreSQL backends, once known
        self._log = log_path.open("w")
        self.started = time.monotonic()
        self.process = subprocess.Popen(
            [sys.executable, "-m", module, *args], env=env, stdout=self._log, stderr=subprocess.STDOUT
        )

    def check_alive(self) -> None:
        """Raise when the process has exited."""
        code = self.process.poll()
        if code is not None:
            raise BenchmarkError(f"{self.name} exited {code}: {self.tail()}")

    def stop(self) -> int:
        """SIGTERM (finish the batch or chunk in flight), then wait; SIGKILL if it will not stop."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                log.warning("service ignored SIGTERM; killing it", service=self.name, pid=self.process.pid)
                self.process.kill()
                self.process.wait(STOP_TIMEOUT_S)
        self._log.close()
        return self.process.returncode

    def records(self) -> list[dict[str, Any]]:
        """The JSON log lines written so far."""
        lines = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            try:
                lines.append(orjson.loads(line))
            except orjson.JSONDecodeError:
                lines.append({"event": line, "level": "raw"})
        return lines

    def tail(self, lines: int = 3) -> str:
        """The last lines of its log, for error messages."""
        return " | ".join(self.log_path.read_text(errors="replace").strip().splitlines()[-lines:])[-400:]


_PARTITION = re.compile(r"^(?P<topic>.+)\[(?P<partition>\d+)\]$")  # "likes[3]", as the pipelines log them


class PipelineProcess(ServiceProcess):
    """One stream runner (`python -m pipelines.cv.runner --streams <stream> --group <group>`) on a bench stream.

    The runner consumes the topic the bench stream declares (`topic`) and nothing else.
    """

    def __init__(self, *, topic: str, stream: str, group: str, env: dict[str, str], log_path: Path) -> None:
        self.topic, self.stream, self.group = topic, stream, group
        args = ["--streams", stream, "--group", group]
        super().__init__("pipeline", "pipelines.cv.runner", args, env=env, log_path=log_path)

    @property
    def pids(self) -> dict[str, int | Sequence[int] | None]:
        """The pipeline process and its PostgreSQL backends, by role."""
        return {"pipeline": self.process.pid, "postgres": self.backend}

    def assignment(self) -> list[int] | None:
        """The partitions of its topic its last rebalance event gave it, from its log (None before the first)."""
        for record in reversed(self.records()):
            if record.get("event") == "partitions assigned":
                found = (_PARTITION.match(str(tp)) for tp in record.get("offsets", {}))
                return [int(m["partition"]) for m in found if m and m["topic"] == self.topic]
            if record.get("event") == "partitions revoked":
                return []
        return None


class PipelineWorkers:
    """`count` pipeline processes in one consumer group, measured as one pipeline.

    Worker i (from 1) names its PostgreSQL sessions `PIPELINE_APPLICATION` with suffix i (none for
    the first) and logs to its own file; CPU is sampled per worker (`pipeline`, `postgres`,
    `pipeline2`, `postgres2`, ...). `settings` (e.g. `{"PIPELINE_BATCH_MAX": "50000"}`) are added to
    each worker's environment; without them the workers run with their default batch settings.
    """

    def __init__(
        self,
        count: int,
        *,
        topic: str,
        stream: str,
        group: str,
        postgres: PostgresSettings,
        kafka: KafkaSettings,
        settings: dict[str, str] | None = None,
    ) -> None:
        self.topic, self.stream, self.group = topic, stream, group
        self.workers = [
            PipelineProcess(
                topic=topic,
                stream=stream,
                group=group,
                env=pipeline_env(postgres, kafka, application_name=PIPELINE_APPLICATION + self._suffix(i))
                | (settings or {}),
                log_path=Path(tempfile.gettempdir()) / f"streamviews-{stream}-pipeline{self._suffix(i)}.log",
            )
            for i in range(count)
        ]
        self.started = self.workers[0].started
        self.log_paths = [w.log_path for w in self.workers]
        # Other processes whose CPU to sample, by role (e.g. kafka); and other PostgreSQL sessions, by
        # role: their application name, whose backends are looked up with the workers'.
        self.also_sampled: dict[str, int | Sequence[int] | None] = {}
        self.also_backends: dict[str, str] = {}

    @staticmethod
    def _suffix(i: int) -> str:
        return str(i + 1) if i else ""

    def find_backends(self, conn: psycopg.Connection) -> None:
        """Look up each worker's PostgreSQL backends, and those of `also_backends`, by their application name."""
        for i, worker in enumerate(self.workers):
            worker.backend = backend_pids(conn, PIPELINE_APPLICATION + self._suffix(i))
        for role, application_name in self.also_backends.items():
            self.also_sampled[role] = backend_pids(conn, application_name)

    @property
    def pids(self) -> dict[str, int | Sequence[int] | None]:
        """Each worker and its PostgreSQL backends, by role, then `also_sampled`."""
        pids = {f"{role}{self._suffix(i)}": pid for i, w in enumerate(self.workers) for role, pid in w.pids.items()}
        return {**pids, **self.also_sampled}

    def settled(self, partitions: Collection[int]) -> bool:
        """True when every worker owns partitions and together they own each of `partitions` once."""
        owned = [w.assignment() for w in self.workers]
        return all(owned) and sorted(p for parts in owned for p in parts or []) == sorted(partitions)

    def check_alive(self) -> None:
        """Raise when a worker has exited."""
        for worker in self.workers:
            worker.check_alive()

    def stop(self) -> int:
        """SIGTERM every worker; the first non-zero exit code, else 0."""
        codes = [worker.stop() for worker in self.workers]
        return next((code for code in codes if code), 0)

    def records(self) -> list[dict[str, Any]]:
        """Every worker's JSON log lines, worker after worker."""
        return [record for worker in self.workers for record in worker.records()]

    def totals(self) -> tuple[dict[str, int], int]:
        """Summed totals of the workers' "pipeline stopped" lines (batches, records, ...), and the warnings logged."""
        records = self.records()
        totals: dict[str, int] = {}
        for stopped in (r for r in records if r.get("event") == "pipeline stopped"):  # one per worker
            for k in ("batches", "records", "changes", "retries"):
                if k in stopped:
                    totals[k] = totals.get(k, 0) + stopped[k]
        return totals, sum(1 for r in records if r.get("level") in {"warning", "error", "critical"})

    def tail(self) -> str:
        """The last lines of each worker's log."""
        return " || ".join(worker.tail() for worker in self.workers)
