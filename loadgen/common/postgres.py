"""PostgreSQL for the benchmarks: the owner's connection, throwaway schemas, pgbench, the server's settings.

- `owner_conninfo`: `sv_owner`, who may create and drop schemas in the database;
- `bench_schema` / `execute`: a schema created for one measurement and dropped with everything in it;
- `pgbench_run` / `pgbench_tps`: one pgbench script, as the seed ran its tests, so every query (the
  seed's and streamviews' own) is measured on equal terms; `pgbench_run` also returns each
  transaction's latency (the friends benchmark's p50/p99);
- `postgres_facts`: the settings that shape every write figure, for the report's machine line.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from loadgen.common.errors import BenchmarkError
from pipelines.settings import ROLE_OWNER, PostgresSettings

PGBENCH = os.environ.get("PGBENCH", "/usr/lib/postgresql/15/bin/pgbench")
_TPS = re.compile(r"^tps = ([0-9.]+) \(without initial connection time\)", re.MULTILINE)
_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")


def owner_conninfo(settings: PostgresSettings | None = None) -> str:
    """Connection string for `sv_owner`, who may create and drop schemas in the database."""
    return (settings or PostgresSettings()).conninfo(user=ROLE_OWNER, application_name="streamviews-bench")


@contextmanager
def bench_schema(schema: str, settings: PostgresSettings | None = None) -> Iterator[str]:
    """Create `schema` as `sv_owner`, yield its name, and drop it with everything in it afterwards."""
    if not _SCHEMA_NAME.match(schema):
        raise BenchmarkError(f"bench schema: {schema!r} is not a plain lower-case identifier")
    conninfo = owner_conninfo(settings)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
    try:
        yield schema
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))


def execute(schema: str, statements: Sequence[str], settings: PostgresSettings | None, **literals: object) -> None:
    """Run statements in autocommit (so VACUUM works), `{s}` bound to the schema and `{name}` to literals."""
    values = {name: sql.Literal(value) for name, value in literals.items()}
    with psycopg.connect(owner_conninfo(settings), autocommit=True) as conn:
        for statement in statements:
            conn.execute(sql.SQL(statement).format(s=sql.Identifier(schema), **values))


def pgbench_script(schema: str, setup: str, query: str) -> str:
    r"""A pgbench script: `\set` lines, then one SQL statement with `{s}` bound to the schema."""
    return setup + sql.SQL(query).format(s=sql.Identifier(schema)).as_string() + "\n"


def pgbench_env(role: str = ROLE_OWNER, settings: PostgresSettings | None = None) -> dict[str, str]:
    """Environment for pgbench as `role` (libpq variables), the password included (for the child's environment only)."""
    settings = settings or PostgresSettings()
    env = {
        "PGHOST": settings.host,
        "PGPORT": str(settings.port),
        "PGDATABASE": settings.database,
        "PGUSER": role,
        "PGAPPNAME": "streamviews-pgbench",
    }
    password = settings.role_password(role)
    if password is None and role == settings.user and settings.password is not None:
        password = settings.password
    if password is not None:
        env["PGPASSWORD"] = password.get_secret_value()
    return env


def pgbench_tps(script_text: str, seconds: int, clients: int = 8, **options: Any) -> float:
    """Run one pgbench script for `seconds` and return its transactions per second (see `pgbench_run`)."""
    return pgbench_run(script_text, seconds, clients, **options)[0]


def pgbench_run(
    script_text: str,
    seconds: int,
    clients: int = 8,
    *,
    threads: int = 2,
    env: Mapping[str, str] | None = None,
    variables: Mapping[str, object] | None = None,
    latencies: bool = False,
) -> tuple[float, list[float]]:
    r"""Run one pgbench script for `seconds`: its transactions per second and, if asked, each one's latency.

    The run is `pgbench -n -M prepared -c clients -j threads -T seconds -f script`, as the seed ran
    its tests (one statement per transaction, so tps = statements/s).

    `env` holds libpq variables (default `pgbench_env()`: sv_owner), `variables` the script's `-D
    name=value`; with `latencies`, every transaction is logged (`-l`) and their latencies returned in ms.

    Raises:
        BenchmarkError: pgbench failed, some client aborted, or no tps line was printed.
    """
    env = dict(env) if env is not None else pgbench_env()
    with tempfile.TemporaryDirectory(prefix="streamviews-pgbench-") as work:
        script = Path(work, "script.sql")
        script.write_text(script_text)
        command = [PGBENCH, "-n", "-M", "prepared", "-c", str(clients), "-j", str(threads), "-T", str(seconds)]
        if latencies:
            command += ["-l", "--log-prefix", str(Path(work, "tx"))]
        for name, value in (variables or {}).items():
            command += ["-D", f"{name}={value}"]
        command += ["-f", str(script)]
        try:
            done = subprocess.run(
                command,
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                timeout=seconds + 120,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BenchmarkError(f"pgbench: could not run {PGBENCH}: {e}") from e
        match = _TPS.search(done.stdout)
        if done.returncode != 0 or match is None:
            tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
            raise BenchmarkError(f"pgbench exited {done.returncode}: {' | '.join(tail)}")
        # Log lines: client_id transaction_no latency_us script_no epoch_s epoch_us
        logged = [int(line.split()[2]) / 1000 for log in Path(work).glob("tx.*") for line in log.open()]
    return float(match.group(1)), logged


def postgres_facts(settings: PostgresSettings | None = None) -> dict[str, str]:
    """Server settings that shape every write figure (durability, memory), for the report header."""
    with psycopg.connect(owner_conninfo(settings)) as conn:
        rows = conn.execute(
            "SELECT name, current_setting(name) FROM pg_settings"
            " WHERE name IN ('server_version', 'synchronous_commit', 'shared_buffers', 'max_wal_size', 'fsync')"
        ).fetchall()
    return dict(rows)


def pgbench_available() -> bool:
    """True when the pgbench binary exists (Debian's postgresql-15 ships it)."""
    return Path(PGBENCH).is_file()
