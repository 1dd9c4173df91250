"""Settings of the local stack: versions, ports, heaps and where its state lives.

Every value has a documented default (see `.env.sample`) and can be overridden from the environment,
so two stacks can run side by side on one machine (different `STACK_STATE_DIR` and ports).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from pydantic import field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parents[1]

MIB = 1024 * 1024


def shared_buffers_for(ram_bytes: int) -> str:
    """PostgreSQL's usual sizing: a quarter of RAM, at least 128MB, at most 8GB.

    The views' state is read and updated at random keys (a like touches its object's, its user's and
    the stream state's rows), so every page outside the buffer pool costs a read and, once the pool is
    full, the write of a dirty page evicted by the backend itself: at 20 M likes (3.8 GiB of tables
    and indexes) that was over half of a like's time with 1GB (docs/performance.md).
    """
    return f"{min(max(ram_bytes // 4, 128 * MIB), 8192 * MIB) // MIB}MB"


def physical_ram() -> int:
    """This machine's RAM in bytes."""
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


class StackSettings(BaseSettings):
    """What `python -m stack` installs and starts."""

    model_config = SettingsConfigDict(extra="ignore", frozen=True)

    stack_state_dir: Path = REPO_ROOT / ".state"
    stack_user: str = "streamviews"
    stack_ready_timeout: float = 240.0
    stack_maven_repo: Path | None = None

    kafka_version: str = "4.3.1"
    debezium_version: str = "3.7.0.Final"
    elasticsearch_version: str = "8.19.21"
    log4j_version: str = "2.25.3"
    postgres_major: int = 15

    pgport: int = 5432
    kafka_port: int = 9092
    kafka_controller_port: int = 9093
    connect_port: int = 8083
    es_port: int = 9200
    es_transport_port: int = 9300
    # Each supervised pipeline serves its Prometheus metrics on its own port (METRICS_PORT).
    streams_metrics_port: int = 9481
    audit_metrics_port: int = 9482
    ctid_puller_metrics_port: int = 9483
    sinks_metrics_port: int = 9484
    inbox_metrics_port: int = 9485
    prometheus_port: int = 9090

    # Prometheus keeps a week (or this much disk, whichever comes first) and scrapes every 5 s, so a
    # test or a person sees a change within seconds.
    prometheus_retention: str = "7d"
    prometheus_retention_size: str = "1GB"
    prometheus_scrape_interval: str = "5s"

    # 256m ran out of heap (java.lang.OutOfMemoryError) on the shared development stack with ~140
    # topics and benchmarks producing millions of events; 512m has room for both.
    kafka_heap: str = "512m"
    connect_heap: str = "384m"
    es_heap: str = "1g"
    # Empty: a quarter of this machine's RAM, at most 8GB (shared_buffers_for).
    pg_shared_buffers: str = ""

    @field_validator("pg_shared_buffers")
    @classmethod
    def _size_shared_buffers(cls, value: str) -> str:
        return value.strip() or shared_buffers_for(physical_ram())

    @property
    def pg_bin(self) -> Path:
        """Debian's PostgreSQL server binaries for the configured major version."""
        return Path(f"/usr/lib/postgresql/{self.postgres_major}/bin")

    @property
    def paths(self) -> StackPaths:
        """Where each part of the stack keeps its files."""
        return StackPaths(self.stack_state_dir.resolve())

    def describe(self) -> dict[str, object]:
        """Effective settings for the start-up log (the stack's own settings hold no secrets)."""
        return {name: str(value) for name, value in self.__dict__.items()}


@dataclass(frozen=True)
class StackPaths:
    """The state directory's layout, derived from its root so nothing else hard-codes a path."""

    root: Path

    @property
    def dist(self) -> Path:
        """Jars and unpacked distributions, one folder per component and version."""
        return self.root / "dist"

    @property
    def build(self) -> Path:
        """What the stack compiles itself: the PostgreSQL extension of pgext/ (stack/pg_extension.py)."""
        return self.root / "build"

    @property
    def secrets(self) -> Path:
        """Generated passwords, one 0600 file each (the `SECRETS_DIR` of the local stack)."""
        return self.root / "secrets"

    @property
    def logs(self) -> Path:
        """Every service's log, `<service>.log`, plus supervisord's captured output."""
        return self.root / "logs"

    @property
    def run(self) -> Path:
        """Supervisord's socket and pid file."""
        return self.root / "run"

    @property
    def supervisord_conf(self) -> Path:
        """The process manager's configuration, rendered on every `up`."""
        return self.root / "supervisord.conf"

    @property
    def env_file(self) -> Path:
        """Client settings pointing at this stack, for `set -a; . .state/stack.env`."""
        return self.root / "stack.env"

    def service(self, name: str) -> Path:
        """A service's own folder: its configuration, data and temporary files."""
        return self.root / name
