"""Preparing the state directory: secrets, rendered configuration, and first-start initialisation.

Configuration files are rendered from `stack/templates/` on every `up`, so a changed port or heap takes
effect on the next `up`. Initialisation (initdb, Kafka storage format, Elasticsearch keystore) runs
once, when its result is missing; data is never touched afterwards.
"""

from __future__ import annotations

import base64
import hashlib
import resource
import secrets
import shutil
import string
import sys
import uuid
from pathlib import Path

from pipelines.logs import get_logger
from pipelines.settings import APP_ROLES, ROLE_CDC, ConnectSettings, secret_file_name
from stack.install import Distributions
from stack.services import PIPELINES, service
from stack.settings import REPO_ROOT, StackPaths, StackSettings
from stack.shell import ServiceUser, make_dir, run, write_file

log = get_logger("stack.configure")

TEMPLATES = Path(__file__).with_name("templates")
ALERT_RULES = REPO_ROOT / "monitoring" / "alerts.yml"  # copied beside the local Prometheus's configuration
PROMETHEUS_BIN = Path("/usr/bin/prometheus")  # Debian's package (stack/install.py)
DATABASE = "streamviews"
APP_DATABASE = "streamviews_app"  # the captured application tables, the CDC role's only database
SECRET_NAMES = (
    secret_file_name("postgres"),
    *(secret_file_name(r) for r in APP_ROLES),
    "elastic_password",
    "connect_password",  # Kafka Connect's REST API (user `streamviews`, CONNECT_USERNAME)
)
CONNECTOR_SECRETS = (secret_file_name(ROLE_CDC),)  # what the Debezium connectors reference
BASIC_AUTH_LOGIN_MODULE = "org.apache.kafka.connect.rest.basic.auth.extension.PropertyFileLoginModule"


class _Template(string.Template):
    """`@{name}` placeholders: `$` and `${...}` belong to the rendered files (log4j2, Connect)."""

    delimiter = "@"


def render(template: str, context: dict[str, object]) -> str:
    """Fill a template from `stack/templates/`; a placeholder without a value is an error."""
    return _Template((TEMPLATES / template).read_text()).substitute(context)


def prepare(settings: StackSettings, user: ServiceUser, dist: Distributions) -> dict[str, object]:
    """Secrets, folders, configuration and first-start initialisation; returns the render context."""
    paths = settings.paths
    ensure_secrets(paths, user)
    # Logs are for the stack's user only: a service may log what it was sent (0750; files 0640).
    for folder in ("logs", "run"):
        make_dir(paths.root / folder, user, 0o750)
    make_dir(paths.logs / "elasticsearch", user, 0o750)
    context = render_context(settings, user, dist)
    configure_postgres(settings, user, dist, context)
    configure_kafka(settings, user, dist, context)
    configure_connect(settings, user, context)
    configure_elasticsearch(settings, user, dist, context)
    configure_prometheus(settings, user, context)
    write_file(paths.supervisord_conf, render_supervisord(context), user, 0o600)
    write_file(paths.env_file, client_env(settings), user)
    write_file(paths.secrets / "pgpass", pgpass(settings), user, 0o600)
    return context


def render_supervisord(context: dict[str, object]) -> str:
    """The process manager's configuration, with one program block per pipeline."""
    programs = "\n".join(
        render(
            "pipeline.program",
            {**context, "pipeline": name, "module": service(name).module, "pipeline_env": pipeline_env(context, name)},
        )
        for name in PIPELINES
    )
    return render(
        "supervisord.conf",
        {**context, "pipeline_programs": programs, "prometheus_digest": prometheus_digest(context)},
    )


def ensure_secrets(paths: StackPaths, user: ServiceUser) -> None:
    """Generate each password once, into its own 0600 file (the local stack's `SECRETS_DIR`).

    No trailing newline: Connect's DirectoryConfigProvider passes a file's content on verbatim.
    """
    make_dir(paths.secrets, user, 0o700)
    for name in SECRET_NAMES:
        path = paths.secrets / name
        value = path.read_text().strip() if path.exists() else secrets.token_urlsafe(24)
        write_file(path, value, user, 0o600)
    # What Kafka Connect's config providers may read: the connectors' own password only. A connector
    # config (anyone can PUT one to a worker) naming another file is refused instead of resolved.
    make_dir(connect_secrets(paths), user, 0o700)
    for name in CONNECTOR_SECRETS:
        write_file(connect_secrets(paths) / name, read_secret(paths, name), user, 0o600)


def connect_secrets(paths: StackPaths) -> Path:
    """The folder Kafka Connect resolves `${dir:...}` references in (`CONNECT_PROVIDERS_DIR`)."""
    return paths.secrets / "connect"


def read_secret(paths: StackPaths, name: str) -> str:
    """One generated password."""
    return (paths.secrets / name).read_text().strip()


def render_context(settings: StackSettings, user: ServiceUser, dist: Distributions) -> dict[str, object]:
    """Every value the templates use, derived from the settings and the installed components."""
    paths = settings.paths
    as_root = user.is_other
    return {
        **{name: value for name, value in settings.__dict__.items()},
        "identifier": f"streamviews:{paths.root}",
        "open_files_limit": min(65536, resource.getrlimit(resource.RLIMIT_NOFILE)[1]),
        "supervisord_user": "user=root" if as_root else "",
        "program_user": f"user={user.name}" if as_root else "",
        "logs_dir": paths.logs,
        "run_dir": paths.run,
        "secrets_dir": paths.secrets,
        "connect_secrets_dir": connect_secrets(paths),
        "java": dist.java,
        "java_home": dist.java_home,
        "pg_bin": settings.pg_bin,
        "app_database": APP_DATABASE,
        "pg_conf": paths.service("postgres") / "conf",
        "pg_data": paths.service("postgres") / "data",
        "pg_socket_dir": paths.service("postgres") / "run",
        "kafka_home": paths.service("kafka"),
        "kafka_data": paths.service("kafka") / "data",
        "kafka_dist": dist.kafka,
        "connect_home": paths.service("connect"),
        "connect_dist": dist.connect,
        "plugin_path": dist.connect_plugins,
        "es_home": paths.service("elasticsearch"),
        "es_dist": dist.elasticsearch,
        "prometheus_bin": PROMETHEUS_BIN,
        "prometheus_home": paths.service("prometheus"),
        "python": sys.executable,
        "repo_root": REPO_ROOT,
        "client_settings": client_settings(settings),
    }


def pipeline_env(context: dict[str, object], name: str) -> str:
    """A supervised pipeline's environment: this stack's client settings, as the pipeline's own role."""
    values = {
        **context["client_settings"],
        "PGUSER": service(name).pg_role,
        # One process per pipeline here: its name is a stable static-membership id, so a pipeline
        # supervisord restarts takes its partitions back at once.
        "PIPELINE_INSTANCE_ID": f"local-{name}",
        # Its own metrics port (STREAMS_METRICS_PORT, ...), which the local Prometheus scrapes.
        "METRICS_PORT": str(context[f"{name}_metrics_port"]),
        # A fault fixed while trying things out (a GRANT given back, a view's table restored) shows
        # within seconds: held streams and quarantined views are tried again after 5 s here, where
        # production's default waits 30 s (both doubling up to 10 minutes: docs/isolation.md).
        "PIPELINE_HOLD_RETRY_S": "5",
        "PIPELINE_VIEW_RETRY_S": "5",
        "LOG_FORMAT": "json",
        "PYTHONUNBUFFERED": "1",
    }
    values.pop("PGPASSFILE", None)
    return ",".join(f'{key}="{value}"' for key, value in values.items())


def configure_postgres(
    settings: StackSettings, user: ServiceUser, dist: Distributions, context: dict[str, object]
) -> None:
    """Its own cluster in the state directory (never the system one), SCRAM passwords only."""
    home = make_dir(settings.paths.service("postgres"), user)
    conf = make_dir(home / "conf", user)
    make_dir(home / "run", user, 0o700)
    data = home / "data"
    if not (data / "PG_VERSION").exists():
        log.info("initialising PostgreSQL cluster", data=str(data))
        make_dir(data, user, 0o700)
        run(
            [
                settings.pg_bin / "initdb",
                "--pgdata",
                data,
                "--username",
                "postgres",
                "--pwfile",
                settings.paths.secrets / secret_file_name("postgres"),
                "--auth",
                "scram-sha-256",
                "--encoding",
                "UTF8",
                "--locale",
                "C.UTF-8",
                "--data-checksums",
            ],
            step="init: initdb",
            as_user=user,
        )
    write_file(conf / "postgresql.conf", render("postgresql.conf", context), user)
    write_file(conf / "pg_hba.conf", render("pg_hba.conf", context), user, 0o600)
    write_file(conf / "pg_ident.conf", "", user, 0o600)


def kafka_cluster_id() -> str:
    """A random cluster id in Kafka's URL-safe base64 form, never starting with '-'.

    Kafka's own `Uuid.randomUuid()` rejects a leading '-' too: the storage tool's argument parser
    reads such an id as an option (1 start in 64 failed before this).
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


def configure_kafka(
    settings: StackSettings, user: ServiceUser, dist: Distributions, context: dict[str, object]
) -> None:
    """Broker + controller configuration; the KRaft storage is formatted on first start."""
    home = make_dir(settings.paths.service("kafka"), user)
    make_dir(home / "tmp", user)
    data = make_dir(home / "data", user)
    write_file(home / "server.properties", render("server.properties", context), user)
    write_file(home / "log4j2.properties", render("log4j2.properties", {**context, "service": "kafka"}), user)
    if not (data / "meta.properties").exists():
        cluster_id = kafka_cluster_id()
        log.info("formatting Kafka storage", cluster_id=cluster_id)
        run(
            [
                dist.java,
                "-cp",
                f"{dist.kafka}/*",
                f"-Dlog4j2.configurationFile={home}/log4j2.properties",
                "kafka.tools.StorageTool",
                "format",
                "--cluster-id",
                cluster_id,
                "--config",
                home / "server.properties",
                "--standalone",
            ],
            step="init: kafka storage format",
            as_user=user,
        )


def configure_connect(settings: StackSettings, user: ServiceUser, context: dict[str, object]) -> None:
    """Distributed worker configuration (its state lives in Kafka topics) and its REST credentials.

    The REST API takes HTTP basic authentication (Kafka's BasicAuthSecurityRestExtension): its JAAS
    login module reads `rest-credentials.properties`, one `user=password` line, 0600.
    """
    home = make_dir(settings.paths.service("connect"), user)
    make_dir(home / "tmp", user)
    credentials = home / "rest-credentials.properties"
    password = read_secret(settings.paths, "connect_password")
    write_file(credentials, f"{ConnectSettings().username}={password}\n", user, 0o600)
    jaas = f'KafkaConnect {{\n  {BASIC_AUTH_LOGIN_MODULE} required\n  file="{credentials}";\n}};\n'
    write_file(home / "rest-jaas.conf", jaas, user, 0o600)
    write_file(home / "worker.properties", render("worker.properties", context), user)
    write_file(home / "log4j2.properties", render("log4j2.properties", {**context, "service": "connect"}), user)


def configure_elasticsearch(
    settings: StackSettings, user: ServiceUser, dist: Distributions, context: dict[str, object]
) -> None:
    """Node configuration and heap; the keystore with `bootstrap.password` is created once."""
    home = make_dir(settings.paths.service("elasticsearch"), user)
    for folder in ("data", "tmp", "logs"):
        make_dir(home / folder, user)
    config = home / "config"
    if not config.exists():
        shutil.copytree(dist.elasticsearch / "config", config)
        _chown_tree(config, user)
    write_file(config / "elasticsearch.yml", render("elasticsearch.yml", context), user, 0o600)
    write_file(
        config / "jvm.options.d" / "streamviews.options",
        f"-Xms{settings.es_heap}\n-Xmx{settings.es_heap}\n"
        # The integ-test distribution lacks analysis-common, which the queryable built-in roles index
        # needs; without this the node logs a failed sync on every start.
        "-Des.queryable_built_in_roles_enabled=false\n",
        user,
    )
    keystore = config / "elasticsearch.keystore"
    if not keystore.exists():
        log.info("creating Elasticsearch keystore with bootstrap.password")
        tool = dist.elasticsearch / "bin" / "elasticsearch-keystore"
        env = {"ES_PATH_CONF": str(config), "ES_JAVA_HOME": str(dist.java_home)}
        run([tool, "create"], step="init: elasticsearch keystore", as_user=user, env=env)
        run(
            [tool, "add", "-x", "bootstrap.password"],
            step="init: elasticsearch keystore",
            as_user=user,
            env=env,
            stdin=read_secret(settings.paths, "elastic_password"),
        )


def configure_prometheus(settings: StackSettings, user: ServiceUser, context: dict[str, object]) -> None:
    """Scrape configuration and alerting rules in the state directory (the service user reads no checkout)."""
    home = make_dir(settings.paths.service("prometheus"), user)
    make_dir(home / "data", user)
    write_file(home / "prometheus.yml", render("prometheus.yml", context), user)
    write_file(home / "alerts.yml", ALERT_RULES.read_text(), user)


def prometheus_digest(context: dict[str, object]) -> str:
    """A fingerprint of Prometheus's configuration and rules: part of its program, so a change restarts it."""
    content = render("prometheus.yml", context) + ALERT_RULES.read_text()
    return hashlib.sha256(content.encode()).hexdigest()[:16]


def _chown_tree(root: Path, user: ServiceUser) -> None:
    if not user.is_other:
        return
    for path in [root, *root.rglob("*")]:
        shutil.chown(path, user.uid, user.gid)


def client_settings(settings: StackSettings) -> dict[str, str]:
    """Settings that point the pipelines, tests and `psql` at this stack (libpq's names and ours)."""
    paths = settings.paths
    return {
        "PGHOST": "127.0.0.1",
        "PGPORT": str(settings.pgport),
        "PGDATABASE": DATABASE,
        "APP_DATABASE": APP_DATABASE,
        "PGPASSFILE": str(paths.secrets / "pgpass"),
        "SECRETS_DIR": str(paths.secrets),
        "KAFKA_BOOTSTRAP_SERVERS": f"127.0.0.1:{settings.kafka_port}",
        "CONNECT_URL": f"http://127.0.0.1:{settings.connect_port}",
        "CONNECT_PROVIDERS_DIR": str(connect_secrets(paths)),
        "ES_URL": f"http://127.0.0.1:{settings.es_port}",
        "ES_USERNAME": "elastic",
    }


def client_env(settings: StackSettings) -> str:
    """`client_settings` as a shell-sourceable file."""
    header = f"# Client settings for the local stack in {settings.paths.root}; written by `python -m stack up`."
    return "\n".join([header, *(f"{k}={v}" for k, v in client_settings(settings).items()), ""])


def pgpass(settings: StackSettings) -> str:
    """A libpq password file for every role, so `psql -U sv_reader` just works with `PGPASSFILE`."""
    lines = []
    for role in ("postgres", *APP_ROLES):
        password = read_secret(settings.paths, secret_file_name(role))
        for host in ("127.0.0.1", "localhost"):
            lines.append(f"{host}:{settings.pgport}:*:{role}:{password}")
    return "\n".join(lines) + "\n"
