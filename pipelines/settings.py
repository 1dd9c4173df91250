"""Typed settings for every component, read from the environment in one place.

Each service builds the settings it needs at start, logs them with `describe()` (secrets redacted),
and passes them down; nothing else reads `os.environ`. Names follow the tools' own conventions where
one exists (libpq's `PGHOST`, `PGPORT`, ...), so `psql` and the services agree on the same variables.

Secrets (`SecretStr` fields) may come from the environment or, as Docker secrets do, from one file per
secret in `SECRETS_DIR`: the field `password` of `PostgresSettings` with `PGUSER=sv_writer` reads
`$SECRETS_DIR/pg_writer_password` when `PGPASSWORD` is unset.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

# Database roles, one per duty (least privilege). The names are a contract shared with sql/ and
# docker-compose.yml.
ROLE_OWNER = "sv_owner"
ROLE_WRITER = "sv_writer"
ROLE_READER = "sv_reader"
ROLE_INDEXER = "sv_indexer"
ROLE_CDC = "sv_cdc"
APP_ROLES = (ROLE_OWNER, ROLE_WRITER, ROLE_READER, ROLE_INDEXER, ROLE_CDC)

# Bounds every role's sessions carry (ALTER ROLE ... SET, applied by dbsetup), so that no query pins a
# core and no open transaction holds locks for ever: (statement_timeout, idle_in_transaction_session_timeout).
# The reader's 10 s covers any search the query functions allow; the pipelines' and the indexer's
# statements are batches of at most PIPELINE_BATCH_MAX rows; the owner backfills new views and CDC
# snapshots whole tables, hence their hour.
ROLE_TIMEOUTS = {
    ROLE_OWNER: ("1h", "10min"),
    ROLE_WRITER: ("2min", "1min"),
    ROLE_READER: ("10s", "1min"),
    ROLE_INDEXER: ("2min", "1min"),
    ROLE_CDC: ("1h", "10min"),
}

# The stream runner's consumer group when PIPELINE_GROUP_ID is empty: the supervised runner's, which
# runs every stream declared without a `consumer_group`.
STREAM_RUNNER_GROUP = "streamviews-streams"


def secret_file_name(role: str) -> str:
    """Name of the file holding a database role's password: `sv_writer` -> `pg_writer_password`."""
    if role == "postgres":
        return "postgres_password"
    return f"pg_{role.removeprefix('sv_')}_password"


def read_secret(name: str, secrets_dir: Path | None) -> SecretStr | None:
    """Read one secret file from `secrets_dir`; None when there is no such folder or file."""
    if secrets_dir is None:
        return None
    path = secrets_dir / name
    if not path.is_file():
        return None
    return SecretStr(path.read_text().strip())


def _has_value(secret: SecretStr | None) -> bool:
    # An empty variable (`PGPASSWORD=` as in .env.sample) means "not set".
    return secret is not None and secret.get_secret_value() != ""


class _Settings(BaseSettings):
    model_config = SettingsConfigDict(extra="ignore", frozen=True, populate_by_name=True)

    secrets_dir: Path | None = Field(None, validation_alias="SECRETS_DIR")

    def describe(self) -> dict[str, Any]:
        """Effective settings for the start-up log, secrets shown as `**********`."""
        return {name: (str(value) if isinstance(value, SecretStr) else value) for name, value in self.__dict__.items()}


class PostgresSettings(_Settings):
    """Where and as whom to connect to PostgreSQL, with libpq's own variable names."""

    model_config = SettingsConfigDict(env_prefix="PG", extra="ignore", frozen=True, populate_by_name=True)

    host: str = "127.0.0.1"
    port: int = 5432
    database: str = "streamviews"
    # The captured application tables (app.likes, app.follows) live in a database of their own, the
    # only one the CDC role may connect to: its REPLICATION attribute then decodes nothing else.
    app_database: str = Field("streamviews_app", validation_alias="APP_DATABASE")
    user: str = ROLE_WRITER
    password: SecretStr | None = None
    application_name: str = Field("streamviews", validation_alias="PGAPPNAME")
    connect_timeout: int = 10

    def model_post_init(self, _context: Any) -> None:
        """Fall back to the role's secret file when no password is in the environment."""
        if not _has_value(self.password):
            object.__setattr__(self, "password", self.role_password(self.user))

    def role_password(self, role: str) -> SecretStr | None:
        """A role's password from its file in `SECRETS_DIR` (`sv_writer` -> `pg_writer_password`)."""
        return read_secret(secret_file_name(role), self.secrets_dir)

    def conninfo(self, **overrides: Any) -> str:
        """A libpq connection string; `overrides` (e.g. `user=`, `dbname=`) win over the settings."""
        from psycopg.conninfo import make_conninfo

        params: dict[str, Any] = {
            "host": self.host,
            "port": self.port,
            "dbname": self.database,
            "user": self.user,
            "application_name": self.application_name,
            "connect_timeout": self.connect_timeout,
        }
        if self.password is not None:
            params["password"] = self.password.get_secret_value()
        params.update(overrides)
        if "user" in overrides and "password" not in overrides:
            # Another role: its own password, never the one of the configured user.
            secret = self.role_password(overrides["user"])
            params.pop("password", None)
            if secret is not None:
                params["password"] = secret.get_secret_value()
        return make_conninfo(**params)


class KafkaSettings(_Settings):
    """Kafka clients' connection; `KAFKA_*` names match the Kafka tools' environment conventions."""

    model_config = SettingsConfigDict(env_prefix="KAFKA_", extra="ignore", frozen=True, populate_by_name=True)

    bootstrap_servers: str = "127.0.0.1:9092"
    client_id: str = "streamviews"


class ElasticsearchSettings(_Settings):
    """Elasticsearch endpoint and credentials (security is on, as Elasticsearch 8 ships)."""

    model_config = SettingsConfigDict(env_prefix="ES_", extra="ignore", frozen=True, populate_by_name=True)

    url: str = "http://127.0.0.1:9200"
    username: str = "elastic"
    password: SecretStr | None = None

    def model_post_init(self, _context: Any) -> None:
        """Fall back to `$SECRETS_DIR/elastic_password`."""
        if not _has_value(self.password):
            object.__setattr__(self, "password", read_secret("elastic_password", self.secrets_dir))

    def basic_auth(self) -> tuple[str, str] | None:
        """Credentials for the client, or None when no password is configured."""
        if self.password is None:
            return None
        return (self.username, self.password.get_secret_value())


class ConnectSettings(_Settings):
    """Kafka Connect's REST endpoint."""

    model_config = SettingsConfigDict(env_prefix="CONNECT_", extra="ignore", frozen=True, populate_by_name=True)

    url: str = "http://127.0.0.1:8083"
    # HTTP basic authentication of the REST API; the password falls back to $SECRETS_DIR/connect_password.
    username: str = "streamviews"
    password: SecretStr | None = None
    secrets_dir: Path | None = Field(None, validation_alias="SECRETS_DIR")
    # The folder the worker's config providers may read: it holds the connectors' own passwords and
    # nothing else, so no connector config can make the worker resolve (and log) another secret.
    # Empty: SECRETS_DIR (where a container is given only its own secrets, /run/secrets).
    providers_dir: Path | None = None

    def model_post_init(self, _context: Any) -> None:
        """Fall back to `$SECRETS_DIR/connect_password`."""
        if not _has_value(self.password):
            object.__setattr__(self, "password", read_secret("connect_password", self.secrets_dir))

    def basic_auth(self) -> tuple[str, str] | None:
        """Credentials for the REST API, or None when no password is configured."""
        if self.password is None:
            return None
        return (self.username, self.password.get_secret_value())


class LogSettings(_Settings):
    """How services log: JSON lines for machines, aligned key=value for a terminal (default: by tty)."""

    model_config = SettingsConfigDict(env_prefix="LOG_", extra="ignore", frozen=True, populate_by_name=True)

    level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    format: Literal["json", "console"] | None = None


class PipelineSettings(_Settings):
    """How a pipeline consumes: its consumer group, batch size and wait, topic layout."""

    model_config = SettingsConfigDict(env_prefix="PIPELINE_", extra="ignore", frozen=True, populate_by_name=True)

    # Empty: `streamviews-<pipeline name>`.
    group_id: str = ""
    # Upper bound of records per batch (one PostgreSQL transaction). Batches only fill up while there
    # is a backlog; then fewer, larger ones cost less per event (a view's groups are upserted once per
    # batch): page views through one runner did 269k events/s at 20,000 and 291k-315k at 50,000.
    batch_max: int = Field(50_000, gt=0)
    # How long one poll waits for records before the batch is applied anyway: bounds freshness at low rates.
    batch_wait_ms: int = Field(100, gt=0)
    # Partitions of the topics a pipeline creates when they are missing (its input and dead-letter
    # topics), unless a stream's declaration says otherwise (WITH (partitions = N)).
    topic_partitions: int = Field(6, gt=0)
    # Seconds between checks of the stream catalog's version (the stream runner): how soon a stream
    # defined or dropped on a running system starts or stops flowing.
    catalog_poll_s: float = Field(1.0, gt=0)
    # Times a definition (`streamviews define`, drop, ...) is tried while locks block it, pausing
    # 0.25 s, 0.5 s, 1 s, ... between (pipelines.cv.catalog.locks): 5 gives up after about 9 s; a
    # deploy script on a busy system may wait longer, a test fail sooner.
    definition_attempts: int = Field(5, gt=0)
    # Seconds between retention sweeps of views with a TTL.
    expire_interval_s: float = Field(60.0, gt=0)
    # Seconds a view's recorded changes are kept (views WITH (changes = true), migration 0020):
    # pruned by the retention sweep, so `streamviews subscribe --from P` can resume within this time.
    changes_retention_s: float = Field(86_400.0, gt=0)
    # Seconds a feed's dead letters are kept (cv.feed_dead_letters, migration 0048): as long as a
    # stream's `.dlq` topic keeps its records by default (the broker's 7 days).
    feed_dead_letters_retention_s: float = Field(604_800.0, gt=0)
    # Views over views (pipelines/cv/feeds.py): whether this runner feeds them (several may: each
    # page is taken once), the most upstream changes one transaction applies to the views reading
    # them, and the seconds between checks when no NOTIFY woke the feeds.
    feeds: bool = True
    feed_page: int = Field(50_000, gt=0)
    feed_poll_s: float = Field(1.0, gt=0)
    # Backfills of new views from their topic's retained history (pipelines/cv/backfill.py): whether
    # this runner catches them up (a child process beside the Kafka loop), the most records of one catch-up
    # batch, the seconds it pauses between batches (the live views go first), and the seconds
    # between looks for a new backfill.
    backfill: bool = True
    backfill_batch_max: int = Field(50_000, gt=0)
    backfill_pause_s: float = Field(0.02, ge=0)
    backfill_poll_s: float = Field(0.5, gt=0)
    # It waits while the live runner is more than this many records behind on the stream (0: never),
    # as long as the live runner commits: one that has not for this many seconds does not stop it.
    backfill_yield_lag: int = Field(10_000, ge=0)
    backfill_yield_max_s: float = Field(2.0, ge=0)
    # The catch-up runs in a child process of the runner (pipelines/cv/backfill_process.py) at this
    # nice value: when both want the CPU, the live loop gets it first (19: the least the backfill can get).
    backfill_nice: int = Field(10, ge=0, le=19)
    # Seconds between progress log lines.
    report_interval_s: float = Field(10.0, gt=0)
    # Isolation (pipelines/cv/isolation.py). A topic whose stream cannot be applied at all is held
    # back (its offsets wait) and read again after this many seconds, doubling up to 10 minutes.
    hold_retry_s: float = Field(30.0, gt=0)
    # A quarantined view is tried again after this many seconds, doubling up to 10 minutes.
    view_retry_s: float = Field(30.0, gt=0)
    # When one view rejects more than this many records of one batch, the view is at fault, not the
    # records: it is quarantined instead, and the records go on to the stream's other views.
    poison_limit: int = Field(100, gt=0)
    # A file the consume loop touches every second, for container healthchecks (empty: none).
    heartbeat_file: str = ""
    # Static group membership (Kafka's group.instance.id): a name for this process that stays the
    # same across its restarts, unique within its group (`hostname`: the machine's, e.g. a container's).
    # A restarted process then takes its partitions back at once, where a new member would wait for
    # the dead one's session to expire. Empty: a new member at every start.
    instance_id: str = ""
    # How long the group waits for a silent member before giving its partitions to the others (the
    # broker's group.min.session.timeout.ms, 6 s by default, is the least it accepts).
    session_timeout_ms: int = Field(10_000, ge=6_000)

    @property
    def group_instance_id(self) -> str | None:
        """`instance_id` as Kafka is given it (`hostname` resolved); None for dynamic membership."""
        if not self.instance_id:
            return None
        return socket.gethostname() if self.instance_id == "hostname" else self.instance_id


class MetricsSettings(_Settings):
    """Where a long-running service serves its Prometheus metrics (`GET /metrics`, pipelines/metrics.py)."""

    model_config = SettingsConfigDict(env_prefix="METRICS_", extra="ignore", frozen=True, populate_by_name=True)

    # Loopback by default: the metrics name topics and streams, which is nobody else's business. A
    # container that Prometheus scrapes from another one listens on 0.0.0.0.
    host: str = "127.0.0.1"
    # 0: no metrics endpoint. Each process needs its own port (the local stack gives the stream
    # runner 9481, the audit writer 9482, the ctid puller 9483 and the sinks' relay 9484).
    port: int = Field(9480, ge=0, le=65535)
    # Seconds between refreshes of the gauges that are read rather than counted: consumer lag, the
    # puller's backlog. Replication slots are read every other refresh (a query, not a local look-up).
    refresh_s: float = Field(5.0, gt=0)


class SinkSettings(_Settings):
    """The sinks' relay (`python -m pipelines.cv.relay`): how much it reads at once, how it waits."""

    model_config = SettingsConfigDict(env_prefix="SINK_", extra="ignore", frozen=True, populate_by_name=True)

    # Changes of one sink read, produced and acknowledged per PostgreSQL transaction: its position
    # advances once per page. An upsert page publishes each group once, so a relay that fell behind
    # reads the commits it missed in a few pages of at most one record per group: at 5,000 it read
    # one runner batch per page (page views at 50,000/s) and could fall further behind.
    page: int = Field(50_000, gt=0)
    # Seconds the relay waits for a `streamviews_changes` notification before it looks anyway (a
    # notification lost with a broken connection costs at most this much delay).
    wake_s: float = Field(5.0, gt=0)
    # Seconds before a sink that failed (its filter raised, Kafka refused) is tried again.
    retry_s: float = Field(30.0, gt=0)


class InboxSettings(_Settings):
    """The inbox relay (`python -m pipelines.cv.inbox`): rows written to streams with SQL, to their topics."""

    model_config = SettingsConfigDict(env_prefix="INBOX_", extra="ignore", frozen=True, populate_by_name=True)

    # Rows produced per Kafka transaction (and deleted from cv.stream_inbox per PostgreSQL statement).
    page: int = Field(10_000, gt=0)
    # Seconds the relay waits for a `streamviews_inbox` notification when the inbox is empty.
    wake_s: float = Field(5.0, gt=0)
    # Seconds a Kafka transaction may take to initialise, commit or abort.
    commit_timeout_s: float = Field(30.0, gt=0)
    # The producer's transactional.id: a relay started under it fences the one before.
    transactional_id: str = "streamviews-inbox"


class AuditSettings(_Settings):
    """The audit log: where its tables live, its Elasticsearch indices, the puller's pace, retention."""

    model_config = SettingsConfigDict(env_prefix="AUDIT_", extra="ignore", frozen=True, populate_by_name=True)

    # Schema of the per-shard, per-day tables (created by `audit.create_log`; dbsetup creates `audit`).
    schema_name: str = Field("audit", validation_alias="AUDIT_SCHEMA", pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    # Elasticsearch indices are `<prefix>-YYYY.MM.DD`; the index template matches `audit-*`.
    index_prefix: str = Field("audit", pattern=r"^audit(-[a-z0-9_]+)*$")
    # Days of audit rows kept by `python -m pipelines.audit.retention` (tables and their documents).
    retention_days: int = Field(30, gt=0)
    # Seconds between retention runs inside the puller service (0: only when run by hand).
    retention_interval_s: float = Field(3600.0, ge=0)
    # Heap blocks the puller reads per Elasticsearch bulk request (8 KiB each, ~14 rows of 512 chars).
    pull_blocks: int = Field(256, gt=0)
    # Bulk requests the puller keeps in flight at once: Elasticsearch indexes them in parallel, even
    # into one shard, while the puller reads on. Each request holds chunks of different tables.
    pull_requests: int = Field(2, gt=0)
    # Seconds the puller sleeps when every table is caught up.
    pull_idle_s: float = Field(0.2, gt=0)
    # Longest back-off while Elasticsearch or PostgreSQL is down: the puller is back at work at most
    # this long after they answer again (a failed request costs them little).
    max_backoff_s: float = Field(4.0, gt=0)


class KibanaSettings(_Settings):
    """Kibana's endpoint, for importing the saved objects (credentials are Elasticsearch's)."""

    model_config = SettingsConfigDict(env_prefix="KIBANA_", extra="ignore", frozen=True, populate_by_name=True)

    url: str = "http://127.0.0.1:5601"
