"""The local stack's configuration renders completely and keeps its promises (loopback, logical WAL, ...)."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest
import yaml

from stack.configure import TEMPLATES, kafka_cluster_id, render, render_context, render_supervisord
from stack.install import Distributions
from stack.settings import StackSettings, physical_ram, shared_buffers_for
from stack.shell import ServiceUser


def _nobody(tmp_path) -> tuple[ServiceUser, Distributions]:
    dist = Distributions(
        java=Path("/usr/lib/jvm/jdk/bin/java"),
        kafka=tmp_path / "kafka",
        connect=tmp_path / "connect",
        connect_plugins=tmp_path / "plugins",
        elasticsearch=tmp_path / "es",
    )
    return ServiceUser("nobody", 65534, 65534), dist


@pytest.fixture
def context(tmp_path, monkeypatch) -> dict[str, object]:
    # Only what the test states: a caller's KAFKA_PORT (say, a second stack on moved ports) must not leak in.
    for field in StackSettings.model_fields:
        monkeypatch.delenv(field.upper(), raising=False)
    settings = StackSettings(stack_state_dir=tmp_path / "state", pgport=15432, kafka_port=19092, es_heap="2g")
    return render_context(settings, *_nobody(tmp_path))


@pytest.mark.parametrize("template", sorted(p.name for p in TEMPLATES.iterdir()))
def test_every_template_renders_without_leftover_placeholders(template, context):
    extra = {
        "service": "kafka",
        "pipeline": "streams",
        "module": "pipelines.cv.runner",
        "pipeline_env": 'PGUSER="sv_writer"',
    }
    text = render_supervisord(context) if template == "supervisord.conf" else render(template, {**context, **extra})
    assert not re.search(r"@\{\w+\}", text)


def test_postgres_listens_on_loopback_with_logical_wal_and_scram(context):
    conf = render("postgresql.conf", context)
    assert "listen_addresses = '127.0.0.1'" in conf
    assert "port = 15432" in conf
    assert "wal_level = logical" in conf
    assert "password_encryption = scram-sha-256" in conf
    assert "%u@%d" in conf  # the escaped @ of the log prefix survives rendering
    hba = [line.split() for line in render("pg_hba.conf", context).splitlines() if line and not line.startswith("#")]
    assert all(rule[-1] in ("scram-sha-256", "reject") for rule in hba)
    assert all(rule[0] == "local" or rule[3] == "127.0.0.1/32" for rule in hba)
    assert all(rule[1] != "replication" for rule in hba), "no physical replication"
    # The CDC role (REPLICATION) reaches the captured tables' database and nothing else: first match wins.
    cdc = [(rule[0], rule[1], rule[-1]) for rule in hba if rule[2] in ("sv_cdc", "all")]
    assert cdc[:3] == [
        ("host", "streamviews_app", "scram-sha-256"),
        ("host", "all", "reject"),
        ("local", "all", "reject"),
    ]


def test_shared_buffers_are_a_quarter_of_ram_within_bounds_unless_set(tmp_path, monkeypatch):
    gib = 1024**3
    assert shared_buffers_for(24 * gib) == "6144MB"
    assert shared_buffers_for(256 * gib) == "8192MB", "at most 8GB"
    assert shared_buffers_for(gib // 4) == "128MB", "at least 128MB"
    monkeypatch.setenv("PG_SHARED_BUFFERS", "")
    assert StackSettings().pg_shared_buffers == shared_buffers_for(physical_ram())
    monkeypatch.setenv("PG_SHARED_BUFFERS", "1GB")
    assert "shared_buffers = 1GB" in render("postgresql.conf", render_context(StackSettings(), *_nobody(tmp_path)))


def test_kafka_runs_kraft_on_loopback_without_topic_auto_creation(context):
    conf = render("server.properties", context)
    assert "process.roles=broker,controller" in conf
    assert "listeners=PLAINTEXT://127.0.0.1:19092,CONTROLLER://127.0.0.1:9093" in conf
    assert "auto.create.topics.enable=false" in conf


def test_connect_finds_plugins_by_service_loader_and_reads_secrets_through_providers(context):
    conf = render("worker.properties", context)
    assert "plugin.discovery=service_load" in conf
    assert "listeners=http://127.0.0.1:8083" in conf
    assert f"config.providers.dir.param.allowed.paths={context['secrets_dir']}" in conf


def test_elasticsearch_is_secured_and_bound_to_loopback(context):
    conf = render("elasticsearch.yml", context)
    assert "network.host: 127.0.0.1" in conf
    assert "xpack.security.enabled: true" in conf


def test_every_service_is_supervised_and_restarted_and_the_servers_run_unprivileged(context):
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(render_supervisord(context))
    programs = [s for s in parser.sections() if s.startswith("program:")]
    assert sorted(programs) == [
        "program:audit",
        "program:connect",
        "program:ctid_puller",
        "program:elasticsearch",
        "program:inbox",
        "program:kafka",
        "program:postgres",
        "program:prometheus",
        "program:sinks",
        "program:streams",
    ]
    for section in programs:
        assert parser[section]["autorestart"] == "true"
    for service in ("postgres", "kafka", "connect", "elasticsearch", "prometheus"):
        assert parser[f"program:{service}"]["user"] == "nobody"
    assert "-Xmx512m" in parser["program:kafka"]["command"]
    for jvm in ("kafka", "connect"):  # a JVM out of heap exits, and supervisord starts it again
        assert "-XX:+ExitOnOutOfMemoryError" in parser[f"program:{jvm}"]["command"]
    assert parser["program:streams"]["command"].endswith("-m pipelines.cv.runner")


def test_each_pipeline_connects_as_its_own_least_privileged_role(context):
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(render_supervisord(context))

    def role(program: str) -> str:
        return re.search(r'PGUSER="(\w+)"', parser[f"program:{program}"]["environment"]).group(1)

    assert role("streams") == role("audit") == role("inbox") == role("sinks") == "sv_writer"
    assert role("ctid_puller") == "sv_indexer"


def test_kafka_cluster_ids_never_start_with_a_dash_that_the_storage_tool_would_read_as_an_option():
    ids = {kafka_cluster_id() for _ in range(2000)}
    assert len(ids) == 2000
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)


def test_prometheus_listens_on_loopback_keeps_its_data_in_the_state_dir_and_scrapes_each_pipeline(context):
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(render_supervisord(context))
    command = parser["program:prometheus"]["command"].split()
    home = context["prometheus_home"]
    assert command[0] == "/usr/bin/prometheus"
    assert "--web.listen-address=127.0.0.1:9090" in command
    assert f"--storage.tsdb.path={home}/data" in command
    assert f"--config.file={home}/prometheus.yml" in command
    assert "--storage.tsdb.retention.time=7d" in command
    assert "--storage.tsdb.retention.size=1GB" in command

    config = yaml.safe_load(render("prometheus.yml", context))
    assert config["global"]["scrape_interval"] == "5s"
    assert config["rule_files"] == ["alerts.yml"]
    targets = {
        group["labels"]["service"]: group["targets"]
        for job in config["scrape_configs"]
        for group in job["static_configs"]
    }
    assert targets == {
        "prometheus": ["127.0.0.1:9090"],
        "streams": ["127.0.0.1:9481"],
        "audit": ["127.0.0.1:9482"],
        "ctid_puller": ["127.0.0.1:9483"],
        "sinks": ["127.0.0.1:9484"],
        "inbox": ["127.0.0.1:9485"],
    }


def test_a_changed_prometheus_configuration_changes_its_program_so_up_restarts_it(context):
    def digest(ctx) -> str:
        parser = configparser.ConfigParser(interpolation=None)
        parser.read_string(render_supervisord(ctx))
        return parser["program:prometheus"]["environment"]

    assert digest(context) == digest(dict(context))
    assert digest(context) != digest({**context, "streams_metrics_port": 19481})
