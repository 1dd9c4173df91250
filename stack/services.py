"""The stack's services: start order, where each logs, and how to tell that it really answers.

A service is ready when a client gets a real answer from it (Kafka metadata, `pg_isready`, Connect's
`/connectors`, Elasticsearch cluster health yellow or green, Prometheus's `/-/ready`), not when its
process exists.
"""

from __future__ import annotations

import base64
import json
import logging
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka.admin import AdminClient

from pipelines.errors import StackError
from pipelines.settings import ROLE_INDEXER, ROLE_WRITER, ConnectSettings
from stack.settings import StackSettings
from stack.supervisor import GAVE_UP, Supervisor

Check = Callable[[], tuple[bool, str]]


@dataclass(frozen=True)
class Service:
    """One supervised program of the stack."""

    name: str
    port_setting: str | None
    logs: tuple[str, ...]
    pg_role: str = ROLE_WRITER  # the database role a pipeline connects as
    module: str = ""  # a pipeline's `python -m` module

    @property
    def is_pipeline(self) -> bool:
        """Pipelines are this project's own consumers; they need the database set up and Kafka ready."""
        return self.port_setting is None

    def port(self, settings: StackSettings) -> int | None:
        """The port its clients use; a pipeline's is where it serves its metrics (`<name>_metrics_port`)."""
        if self.port_setting:
            return int(getattr(settings, self.port_setting))
        return getattr(settings, f"{self.name}_metrics_port", None)

    def log_files(self, settings: StackSettings) -> list[Path]:
        """Its log files, most useful first."""
        return [settings.paths.logs / name for name in self.logs]


# In start order: Connect needs Kafka; everything else is independent.
SERVICES = (
    Service("postgres", "pgport", ("postgres.log",)),
    Service("kafka", "kafka_port", ("kafka.log", "kafka.out")),
    Service("elasticsearch", "es_port", ("elasticsearch/streamviews.log", "elasticsearch.out")),
    Service("connect", "connect_port", ("connect.log", "connect.out")),
    # Scrapes the pipelines below and itself; the alerting rules are monitoring/alerts.yml.
    Service("prometheus", "prometheus_port", ("prometheus.log",)),
    # Every declared stream (sql/views/ and whatever users define) runs in `streams`.
    Service("streams", None, ("streams.log",), module="pipelines.cv.runner"),
    Service("audit", None, ("audit.log",), module="pipelines.audit.writer"),
    Service("ctid_puller", None, ("ctid_puller.log",), pg_role=ROLE_INDEXER, module="pipelines.audit.puller"),
    # Each sink's view changes to its Kafka topic (CREATE SINK, pipelines/cv/relay/).
    Service("sinks", None, ("sinks.log",), module="pipelines.cv.relay"),
    # Rows written to streams with SQL (INSERT INTO <stream>) to their topics (pipelines/cv/inbox.py).
    Service("inbox", None, ("inbox.log",), module="pipelines.cv.inbox"),
)
PIPELINES = tuple(s.name for s in SERVICES if s.is_pipeline)
SERVICE_NAMES = tuple(s.name for s in SERVICES)


def service(name: str) -> Service:
    """Look a service up by name."""
    for candidate in SERVICES:
        if candidate.name == name:
            return candidate
    raise StackError(f"unknown service {name!r}; known: {', '.join(SERVICE_NAMES)}")


def readiness_check(name: str, settings: StackSettings, elastic_password: str) -> Check:
    """The client-side probe that says whether `name` serves requests."""
    if name == "postgres":
        return lambda: _pg_isready(settings.pg_bin, settings.pgport)
    if name == "kafka":
        return lambda: _kafka_metadata(settings.kafka_port)
    if name == "connect":
        auth = ConnectSettings(secrets_dir=settings.paths.secrets).basic_auth()
        return lambda: _http_ok(f"http://127.0.0.1:{settings.connect_port}/connectors", auth)
    if name == "elasticsearch":
        return lambda: _es_health(settings.es_port, elastic_password)
    if name == "prometheus":
        # 200 once the TSDB is open and the configuration loaded (503 while it replays its WAL).
        url = f"http://127.0.0.1:{settings.prometheus_port}/-/ready"
        return lambda: _once_started(settings, name, lambda: _http_ok(url))
    if service(name).is_pipeline:
        return lambda: _supervised_for(settings, name, seconds=3)
    raise StackError(f"no readiness check for {name}")


def _once_started(settings: StackSettings, name: str, check: Check) -> tuple[bool, str]:
    """`check`, once supervisord counts the process as started (past its `startsecs`).

    Prometheus answers within a second, before supervisord calls it RUNNING: ready that early, `up`
    would report it STARTING, and not ready, in the status it prints.
    """
    state = Supervisor(settings.paths).processes()[name].state
    return check() if state == "RUNNING" else (False, state)


def _supervised_for(settings: StackSettings, name: str, seconds: int) -> tuple[bool, str]:
    """A pipeline is ready once it has stayed up past its start-up (topics ensured, group joined)."""
    info = Supervisor(settings.paths).processes()[name]
    return info.state == "RUNNING" and info.uptime_s >= seconds, f"{info.state}, up {info.uptime_s}s"


def wait_ready(name: str, check: Check, supervisor: Supervisor, settings: StackSettings) -> float:
    """Poll `check` until it passes; fail with the service's log tail if it gives up or time runs out.

    Returns the seconds waited.
    """
    started = time.monotonic()
    deadline = started + settings.stack_ready_timeout
    detail = ""
    while time.monotonic() < deadline:
        ok, detail = check()
        if ok:
            return time.monotonic() - started
        state = supervisor.processes()[name].state
        if state in GAVE_UP:
            raise StackError(f"{name} is {state}: {detail}\n{log_tail(name, settings)}")
        time.sleep(0.5)
    raise StackError(
        f"{name} not ready after {settings.stack_ready_timeout:.0f}s: {detail}\n{log_tail(name, settings)}"
    )


def log_tail(name: str, settings: StackSettings, lines: int = 40) -> str:
    """The last lines of each of a service's logs, for error messages."""
    parts = []
    for path in service(name).log_files(settings):
        if path.exists():
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            parts.append(f"--- {path} (last {len(tail)} lines) ---\n" + "\n".join(tail))
    return "\n".join(parts) or f"(no log files for {name} yet under {settings.paths.logs})"


def _pg_isready(pg_bin: Path, port: int) -> tuple[bool, str]:
    done = subprocess.run(
        [pg_bin / "pg_isready", "-h", "127.0.0.1", "-p", str(port), "-t", "2"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode == 0, done.stdout.strip()


_quiet = logging.getLogger("stack.kafka-probe")
_quiet.setLevel(logging.CRITICAL)


def _kafka_metadata(port: int) -> tuple[bool, str]:
    admin = AdminClient({"bootstrap.servers": f"127.0.0.1:{port}", "logger": _quiet})
    try:
        metadata = admin.list_topics(timeout=2)
    except Exception as e:
        return False, f"metadata request failed: {e}"
    return bool(metadata.brokers), f"{len(metadata.brokers)} broker(s), {len(metadata.topics)} topic(s)"


def _http_get(url: str, auth: tuple[str, str] | None = None, timeout: float = 3) -> tuple[int, bytes]:
    request = urllib.request.Request(url)  # noqa: S310 - loopback URL built from settings
    if auth:
        token = base64.b64encode(f"{auth[0]}:{auth[1]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def _http_ok(url: str, auth: tuple[str, str] | None = None) -> tuple[bool, str]:
    try:
        status, _ = _http_get(url, auth=auth)
    except OSError as e:
        return False, f"GET {url}: {e}"
    return status == 200, f"GET {url}: HTTP {status}"


def _es_health(port: int, password: str) -> tuple[bool, str]:
    url = f"http://127.0.0.1:{port}/_cluster/health"
    try:
        status, body = _http_get(url, auth=("elastic", password))
    except OSError as e:
        return False, f"GET {url}: {e}"
    if status != 200:
        return False, f"GET {url}: HTTP {status}"
    health = json.loads(body)["status"]
    return health in {"yellow", "green"}, f"cluster health {health}"
