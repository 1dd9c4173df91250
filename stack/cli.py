"""`python -m stack up|down|status|logs|start|stop|env`: the local stack, without Docker.

`up` installs what is missing, renders configuration, starts supervisord and then each service in
order, returning only when every service answers its readiness probe (or failing with the log tail
of the one that does not). It is idempotent: on a warm machine it checks and returns in seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import subprocess
import sys
import time

import psycopg

from pipelines.audit import elastic
from pipelines.audit.backlog import backlog
from pipelines.cdc import connectors
from pipelines.cv.cli_common import kafka_admin
from pipelines.cv.status import age, runner_status, status_table
from pipelines.dbsetup import setup_database
from pipelines.errors import StackError, StreamviewsError
from pipelines.logs import configure_logging, get_logger
from pipelines.settings import (
    ROLE_INDEXER,
    ROLE_WRITER,
    STREAM_RUNNER_GROUP,
    AuditSettings,
    ConnectSettings,
    ElasticsearchSettings,
    KafkaSettings,
    LogSettings,
    PostgresSettings,
)
from stack.configure import APP_DATABASE, DATABASE, connect_secrets, prepare, read_secret
from stack.install import install
from stack.procmem import tree_memory_mib
from stack.services import SERVICE_NAMES, SERVICES, readiness_check, service, wait_ready
from stack.settings import StackSettings
from stack.supervisor import RUNNING, Supervisor

log = get_logger("stack")


def up(settings: StackSettings) -> None:
    """Install, configure and start everything; return when every service is ready."""
    started = time.monotonic()
    log.info("stack up", **settings.describe())
    user, dist = install(settings)
    prepare(settings, user, dist)
    supervisor = Supervisor(settings.paths)
    if supervisor.is_running():
        changed = supervisor.reload_config()
        if changed:
            log.info("configuration changed; restarting", services=changed)
    else:
        check_ports_free(settings)
        supervisor.start_daemon()
    elastic_password = read_secret(settings.paths, "elastic_password")
    for svc in SERVICES:
        if svc.name == "connect" or svc.is_pipeline:
            # Connect keeps its state in Kafka topics, pipelines consume them: start once the broker answers.
            _wait(settings, supervisor, "kafka", elastic_password)
        supervisor.start(svc.name)
        if svc.name == "postgres":
            _wait(settings, supervisor, "postgres", elastic_password)
            admin = admin_settings(settings)
            # A running server keeps its old pg_hba.conf until told: the one just rendered may be stricter.
            with psycopg.connect(admin.conninfo(dbname="postgres"), autocommit=True) as conn:
                conn.execute("SELECT pg_reload_conf()")
            setup_database(admin)
    for name in SERVICE_NAMES:
        _wait(settings, supervisor, name, elastic_password)
    connectors.apply(
        ConnectSettings(
            url=f"http://127.0.0.1:{settings.connect_port}",
            providers_dir=connect_secrets(settings.paths),
            secrets_dir=settings.paths.secrets,
        ),
        PostgresSettings(
            host="127.0.0.1",
            port=settings.pgport,
            database=DATABASE,
            app_database=APP_DATABASE,
            secrets_dir=settings.paths.secrets,
        ),
    )
    es_settings = ElasticsearchSettings(url=f"http://127.0.0.1:{settings.es_port}", secrets_dir=settings.paths.secrets)
    with elastic.client(es_settings) as es:
        elastic.apply_index_templates(es)
    log.info("stack ready", seconds=round(time.monotonic() - started, 1), env_file=str(settings.paths.env_file))


def _wait(settings: StackSettings, supervisor: Supervisor, name: str, password: str) -> None:
    waited = wait_ready(name, readiness_check(name, settings, password), supervisor, settings)
    if waited > 0.5:
        log.info("service ready", service=name, waited_s=round(waited, 1))


def admin_settings(settings: StackSettings) -> PostgresSettings:
    """Superuser connection to the local cluster, for roles and migrations."""
    return PostgresSettings(
        host="127.0.0.1",
        port=settings.pgport,
        database=DATABASE,
        app_database=APP_DATABASE,
        user="postgres",
        password=None,
        secrets_dir=settings.paths.secrets,
    )


def check_ports_free(settings: StackSettings) -> None:
    """Fail before starting anything when another process holds one of the stack's ports."""
    ports = {
        "PGPORT": settings.pgport,
        "KAFKA_PORT": settings.kafka_port,
        "KAFKA_CONTROLLER_PORT": settings.kafka_controller_port,
        "CONNECT_PORT": settings.connect_port,
        "ES_PORT": settings.es_port,
        "ES_TRANSPORT_PORT": settings.es_transport_port,
        "STREAMS_METRICS_PORT": settings.streams_metrics_port,
        "AUDIT_METRICS_PORT": settings.audit_metrics_port,
        "CTID_PULLER_METRICS_PORT": settings.ctid_puller_metrics_port,
        "SINKS_METRICS_PORT": settings.sinks_metrics_port,
        "INBOX_METRICS_PORT": settings.inbox_metrics_port,
        # Debian's own prometheus.service, where systemd started it, listens on 9090 too.
        "PROMETHEUS_PORT": settings.prometheus_port,
    }
    for variable, port in ports.items():
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(("127.0.0.1", port))
            except OSError as e:
                raise StackError(
                    f"port {port} is taken by another process ({e.strerror}); set {variable} to a free port"
                ) from e


def down(settings: StackSettings) -> None:
    """Stop every service (reverse start order), then supervisord. Data stays in the state directory."""
    supervisor = Supervisor(settings.paths)
    if not supervisor.is_running():
        log.info("stack is not running", state_dir=str(settings.paths.root))
        return
    for name in reversed(SERVICE_NAMES):
        supervisor.stop(name)
    supervisor.shutdown()
    log.info("stack stopped", state_dir=str(settings.paths.root))


def status(settings: StackSettings) -> int:
    """Print each service's state, readiness, port and memory; exit 1 unless all are ready."""
    supervisor = Supervisor(settings.paths)
    if not supervisor.is_running():
        print(f"stack not running (state dir {settings.paths.root}); start it with `make up`")
        return 1
    password = read_secret(settings.paths, "elastic_password")
    processes = supervisor.processes()
    print(f"{'service':<14}{'state':<10}{'pid':>8}{'uptime':>9}{'port':>7}{'memory':>11}  ready")
    all_ready = True
    for svc in SERVICES:
        info = processes[svc.name]
        ready, detail = (False, "not running")
        if info.state == RUNNING:
            ready, detail = readiness_check(svc.name, settings, password)()
        all_ready &= ready
        memory = f"{tree_memory_mib(info.pid):.0f} MiB" if info.pid else "-"
        print(
            f"{svc.name:<14}{info.state:<10}{info.pid or '-':>8}{info.uptime_s:>8}s{svc.port(settings) or '-':>7}"
            f"{memory:>11}  {'yes' if ready else 'NO'} ({detail})"
        )
    if processes["postgres"].state == RUNNING and processes["kafka"].state == RUNNING:
        print()
        for line in pipeline_lag(settings):
            print(line)
    print(f"\nclient settings: {settings.paths.env_file}   logs: {settings.paths.logs}")
    return 0 if all_ready else 1


def pipeline_lag(settings: StackSettings) -> list[str]:
    """How far the pipelines are behind, and how fresh: each stream for the supervised runner's group, the puller.

    Read as `streamviews status` reads it (offsets stored in PostgreSQL against Kafka's high
    watermarks) and from the audit ledger; a failure is one line, never the end of `status`.
    """
    postgres = admin_settings(settings)  # each role's password from the stack's secrets
    kafka = KafkaSettings(bootstrap_servers=f"127.0.0.1:{settings.kafka_port}")
    lines = []
    try:
        with psycopg.connect(postgres.conninfo(user=ROLE_WRITER), connect_timeout=5) as conn:
            statuses = runner_status(conn, kafka_admin(kafka), kafka, STREAM_RUNNER_GROUP)
        lines.append(status_table(STREAM_RUNNER_GROUP, statuses))
    except (psycopg.Error, StreamviewsError) as e:
        lines.append(f"stream lag unavailable: {str(e).strip().splitlines()[0]}")
    audit = AuditSettings()
    try:
        with psycopg.connect(postgres.conninfo(user=ROLE_INDEXER), connect_timeout=5) as conn:
            behind = backlog(conn, audit.schema_name)
    except psycopg.Error as e:
        lines.append(f"audit puller lag unavailable: {str(e).strip().splitlines()[0]}")
    else:
        last = behind.last_checkpoint.strftime("%Y-%m-%d %H:%M:%S %Z") if behind.last_checkpoint else "never"
        fresh = "caught up" if behind.indexed_up_to_s is None else f"writes up to {age(behind.indexed_up_to_s)} indexed"
        lines.append(
            f"\naudit puller ({audit.schema_name}): {behind.rows_behind} rows behind in {behind.tables} tables;"
            f" {fresh}; last checkpoint {last}"
        )
    return lines


def logs(settings: StackSettings, names: list[str], follow: bool, lines: int) -> None:
    """Show (or follow) the services' log files."""
    files = [
        str(path) for name in (names or SERVICE_NAMES) for path in service(name).log_files(settings) if path.exists()
    ]
    if not files:
        print(f"no logs yet under {settings.paths.logs}")
        return
    cmd = ["tail", f"-n{lines}", *(["-F"] if follow else []), *files]
    with contextlib.suppress(KeyboardInterrupt):
        subprocess.run(cmd, check=False)


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m stack`."""
    parser = argparse.ArgumentParser(prog="python -m stack", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("up", help="install what is missing, start everything, wait until ready")
    commands.add_parser("down", help="stop every service and supervisord (data is kept)")
    commands.add_parser("status", help="state, readiness, port and memory of each service")
    commands.add_parser("env", help="print the client settings for this stack (source it in a shell)")
    logs_cmd = commands.add_parser("logs", help="show the services' logs")
    logs_cmd.add_argument("services", nargs="*", choices=[[], *SERVICE_NAMES], default=[])
    logs_cmd.add_argument("-f", "--follow", action="store_true")
    logs_cmd.add_argument("-n", "--lines", type=int, default=30)
    for verb in ("start", "stop"):
        cmd = commands.add_parser(verb, help=f"{verb} one service (supervised)")
        cmd.add_argument("service", choices=SERVICE_NAMES)
    args = parser.parse_args(argv)

    configure_logging(LogSettings())
    settings = StackSettings()
    try:
        if args.command == "up":
            up(settings)
            return status(settings)
        if args.command == "down":
            down(settings)
        elif args.command == "status":
            return status(settings)
        elif args.command == "env":
            print(settings.paths.env_file.read_text(), end="")
        elif args.command == "logs":
            logs(settings, args.services, args.follow, args.lines)
        elif args.command == "start":
            Supervisor(settings.paths).start(args.service)
        elif args.command == "stop":
            Supervisor(settings.paths).stop(args.service)
    except StreamviewsError as e:
        log.error(str(e))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
