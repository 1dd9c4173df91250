"""The production stack's definition: docker-compose.yml, .env, docker/*/Dockerfile and friends.

These read the files only; no container engine or service is needed. test_compose_cli.py asks the real
Compose CLI (built by `make up`) the same questions.
"""

from __future__ import annotations

import re
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipelines.settings import secret_file_name

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
DOTENV = ROOT / ".env"
GEN_SECRETS = ROOT / "docker" / "gen-secrets.sh"

# What Compose interpolates: ${NAME} (with an optional :-default etc.). "$$" is a literal dollar.
BRACED_VARIABLE = re.compile(r"(?<!\$)\$\{([A-Za-z_][A-Za-z0-9_]*)(?:[:?+-][^}]*)?\}")
BARE_VARIABLE = re.compile(r"(?<!\$)\$(?![${])([A-Za-z_][A-Za-z0-9_]*)")
SECRET_LIKE = re.compile(r"PASS|SECRET|TOKEN|CREDENTIAL|API_?KEY|PRIVATE", re.IGNORECASE)

SECRET_NAMES = {
    "postgres_password",
    "pg_owner_password",
    "pg_writer_password",
    "pg_reader_password",
    "pg_indexer_password",
    "pg_cdc_password",
    "elastic_password",
    "kibana_password",
    "connect_password",
    "grafana_password",
}
# Derived by docker/gen-secrets.sh from the passwords: Connect's `user=password` file.
DERIVED_SECRETS = {"connect_credentials"}
# The settings the Python code reads (pipelines/settings.py); passwords come from $SECRETS_DIR files.
CLIENT_SETTINGS = {
    "PGHOST",
    "PGPORT",
    "PGUSER",
    "PGDATABASE",
    "KAFKA_BOOTSTRAP_SERVERS",
    "ES_URL",
    "ES_USERNAME",
    "CONNECT_URL",
    "KIBANA_URL",
    "PIPELINE_HEARTBEAT_FILE",
    "PIPELINE_INSTANCE_ID",
    "METRICS_HOST",
    "METRICS_PORT",
    "SECRETS_DIR",
    "LOG_LEVEL",
    "LOG_FORMAT",
}


def read_dotenv(path: Path) -> dict[str, str]:
    values = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert sep, f"{path.name}: not NAME=value: {raw!r}"
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
            value = value[1:-1]
        values[name.strip()] = value
    return values


def read_properties(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line.strip() and line[0] not in "#!")
    return {key.strip(): value.strip() for key, value in pairs}


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(key): str(value) for key, value in env.items()}


def strings_in(node: Any) -> list[str]:
    """Every string value in a parsed YAML document: what Compose interpolates (comments are not)."""
    if isinstance(node, dict):
        return [text for value in node.values() for text in strings_in(value)]
    if isinstance(node, list):
        return [text for value in node for text in strings_in(value)]
    return [node] if isinstance(node, str) else []


def dockerfile_of(service: dict[str, Any]) -> Path:
    build = service["build"]
    return ROOT / build["context"] / build.get("dockerfile", "Dockerfile")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture(scope="module")
def python_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services that run the streamviews Python image (x-pipeline)."""
    image = compose["x-pipeline"]["image"]
    return {name: service for name, service in compose["services"].items() if service.get("image") == image}


@pytest.fixture(scope="module")
def dotenv() -> dict[str, str]:
    return read_dotenv(DOTENV)


def test_dotenv_pins_each_component_version(dotenv: dict[str, str]) -> None:
    assert dotenv["COMPOSE_PROJECT_NAME"] == "streamviews"
    assert re.fullmatch(r"\d+\.\d+\.\d+", dotenv["KAFKA_VERSION"])
    assert re.fullmatch(r"\d+\.\d+\.\d+\.Final", dotenv["DEBEZIUM_VERSION"])
    assert re.fullmatch(r"\d+\.\d+\.\d+", dotenv["ELASTIC_VERSION"])
    assert re.fullmatch(r"\d+", dotenv["POSTGRES_MAJOR"])
    assert re.fullmatch(r"2\.\d+\.\d+", dotenv["TIMESCALEDB_VERSION"])
    for image in ("PYTHON_IMAGE", "MAVEN_IMAGE"):
        name, _, tag = dotenv[image].rpartition(":")
        assert name, f"{image} must name an image"
        assert tag not in {"", "latest"}, f"{image} must name an explicit tag"


def test_production_and_local_stacks_run_the_same_versions(dotenv: dict[str, str]) -> None:
    def pom_property(pom: str, name: str) -> str:
        match = re.search(rf"<{re.escape(name)}>([^<]+)</", (ROOT / "stack" / "maven" / pom).read_text())
        assert match, f"stack/maven/{pom} has no <{name}>"
        return match[1]

    assert pom_property("kafka.xml", "kafka.version") == dotenv["KAFKA_VERSION"]
    assert pom_property("connect.xml", "kafka.version") == dotenv["KAFKA_VERSION"]
    assert pom_property("debezium.xml", "debezium.version") == dotenv["DEBEZIUM_VERSION"]
    assert pom_property("elasticsearch.xml", "elasticsearch.version") == dotenv["ELASTIC_VERSION"]


def test_every_image_is_tagged_by_a_dotenv_variable(
    services: dict[str, dict[str, Any]], dotenv: dict[str, str]
) -> None:
    for name, service in services.items():
        image = service.get("image", "")
        match = re.fullmatch(r"[a-z0-9./_-]+:\$\{([A-Z0-9_]+)\}", image)
        assert match, f"{name}: image {image!r} must be <repository>:${{VARIABLE}}"
        assert match[1] in dotenv, f"{name}: {match[1]} is not set in .env"


def test_build_args_carry_the_dotenv_variable_of_the_same_name(
    services: dict[str, dict[str, Any]], dotenv: dict[str, str]
) -> None:
    built = {name: service for name, service in services.items() if "build" in service}
    assert {"postgres", "connect", "dbsetup", "kibana"} <= built.keys()
    for name, service in built.items():
        for arg, value in (service["build"].get("args") or {}).items():
            assert value == f"${{{arg}}}", f"{name}: build arg {arg} must be ${{{arg}}}, not {value!r}"
            assert arg in dotenv, f"{name}: build arg {arg} is not set in .env"


def test_dockerfile_args_are_dotenv_variables_passed_by_compose(
    services: dict[str, dict[str, Any]], dotenv: dict[str, str]
) -> None:
    passed: dict[Path, set[str]] = {}
    for service in services.values():
        if "build" in service:
            passed.setdefault(dockerfile_of(service), set()).update(service["build"].get("args") or {})
    dockerfiles = sorted((ROOT / "docker").glob("*/Dockerfile"))
    assert set(dockerfiles) == set(passed), "every Dockerfile is built by some service, and only those"
    for dockerfile in dockerfiles:
        text = dockerfile.read_text()
        args = re.findall(r"^ARG\s+(\S+)", text, flags=re.MULTILINE)
        assert args, f"{dockerfile}: versions must come in as build args"
        for arg in args:
            assert "=" not in arg, f"{dockerfile}: ARG {arg} has a default; .env is the only source"
            assert arg in dotenv, f"{dockerfile}: ARG {arg} is not set in .env"
            assert arg in passed[dockerfile], f"{dockerfile}: compose does not pass ARG {arg}"
        for base in re.findall(r"^FROM\s+(\S+)", text, flags=re.MULTILINE):
            assert "${" in base, f"{dockerfile}: base image {base} must be versioned by a build arg"


def test_every_interpolated_variable_is_defined_in_dotenv(compose: dict[str, Any], dotenv: dict[str, str]) -> None:
    values = strings_in(compose)
    used = {name for text in values for name in BRACED_VARIABLE.findall(text)}
    assert used, "the compose file takes its versions and ports from .env"
    assert used <= dotenv.keys(), f"not set in .env: {sorted(used - dotenv.keys())}"
    # A shell variable must be written $$name; a bare $name would be interpolated by Compose.
    assert not [text for text in values if BARE_VARIABLE.search(text)]


def test_every_service_is_a_one_shot_job_or_restarts_with_a_healthcheck(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        restart = service.get("restart")
        assert restart in {"no", "unless-stopped", "always"}, f"{name}: say how it restarts"
        if restart != "no":
            healthcheck = service.get("healthcheck") or {}
            assert healthcheck.get("test"), f"{name} is long-running and needs a healthcheck"
            assert not healthcheck.get("disable")


def test_one_shot_jobs_gate_the_services_that_need_them(services: dict[str, dict[str, Any]]) -> None:
    assert services["dbsetup"]["restart"] == "no"
    assert services["dbsetup"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["kibana-setup"]["restart"] == "no"
    assert services["kibana"]["depends_on"]["kibana-setup"]["condition"] == "service_completed_successfully"


def test_no_literal_secret_in_compose_or_dotenv(services: dict[str, dict[str, Any]], dotenv: dict[str, str]) -> None:
    assert not [name for name in dotenv if SECRET_LIKE.search(name)], ".env holds no secrets"
    for name, service in services.items():
        for key, value in environment(service).items():
            if not SECRET_LIKE.search(key):
                continue
            if key == "SECRETS_DIR":
                assert value == "/run/secrets"
            else:
                assert key.endswith("_FILE"), f"{name}: {key} must be a *_FILE pointing at a secret"
                assert value.startswith("/run/secrets/"), f"{name}: {key} must point into /run/secrets"
    text = COMPOSE_FILE.read_text()
    assert not re.search(r"(?i)password\s*[:=]\s*['\"]?[A-Za-z0-9]{6,}", text)
    assert not re.search(r"-u\s+['\"]?\w+:[^$\s]", text), "curl credentials come from a file, not argv"


def test_secrets_are_the_generated_files_and_services_use_only_declared_ones(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    declared = compose["secrets"]
    assert set(declared) == SECRET_NAMES | DERIVED_SECRETS
    for name, spec in declared.items():
        assert spec == {"file": f"./secrets/{name}"}
    used = set()
    for name, service in services.items():
        refs = {ref if isinstance(ref, str) else ref["source"] for ref in service.get("secrets", [])}
        assert refs <= set(declared), f"{name} uses an undeclared secret"
        used |= refs
    assert used == set(declared), f"declared but unused: {sorted(set(declared) - used)}"
    listed = re.search(r"SECRET_NAMES=\((.*?)\n\)", GEN_SECRETS.read_text(), flags=re.DOTALL)
    assert listed
    assert set(re.findall(r"^\s*(\w+)", listed[1], flags=re.MULTILINE)) == SECRET_NAMES


def test_gen_secrets_creates_each_password_once(tmp_path: Path) -> None:
    script = tmp_path / "docker" / "gen-secrets.sh"
    script.parent.mkdir()
    shutil.copy(GEN_SECRETS, script)
    subprocess.run(["bash", str(script)], check=True, capture_output=True)
    folder = tmp_path / "secrets"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700, "only the owner may enter ./secrets"
    first = {path.name: path.read_text() for path in folder.iterdir()}
    assert set(first) == SECRET_NAMES | DERIVED_SECRETS
    assert first["connect_credentials"] == f"streamviews={first['connect_password']}\n"
    for name, value in first.items():
        if name in DERIVED_SECRETS:
            continue
        assert re.fullmatch(r"[A-Za-z0-9]{32}", value), f"{name}: 32 alphanumerics, no trailing newline"
    assert len(set(first.values())) == len(first)
    subprocess.run(["bash", str(script)], check=True, capture_output=True)
    assert {path.name: path.read_text() for path in folder.iterdir()} == first, "existing secrets are kept"


def test_secrets_folder_is_git_ignored() -> None:
    ignored = (ROOT / ".gitignore").read_text().splitlines()
    assert "secrets/" in ignored or "/secrets/" in ignored


def test_published_ports_bind_to_bind_address(services: dict[str, dict[str, Any]], dotenv: dict[str, str]) -> None:
    assert dotenv["BIND_ADDRESS"] == "127.0.0.1", "nothing is reachable from other hosts by default"
    published = 0
    for name, service in services.items():
        for port in service.get("ports", []):
            published += 1
            if isinstance(port, dict):
                assert port.get("host_ip") == "${BIND_ADDRESS}", f"{name}: {port}"
            else:
                assert str(port).startswith("${BIND_ADDRESS}:"), f"{name}: {port}"
    assert published >= 5


def test_stateful_services_keep_their_data_in_named_volumes(
    compose: dict[str, Any], services: dict[str, dict[str, Any]]
) -> None:
    data_paths = {
        "postgres": "/var/lib/postgresql/data",
        "kafka": "/var/lib/kafka/data",
        "elasticsearch": "/usr/share/elasticsearch/data",
    }
    for name, path in data_paths.items():
        mounts = dict(reversed(volume.split(":")[:2]) for volume in services[name]["volumes"])
        assert path in mounts, f"{name} must mount a volume at {path}"
        assert mounts[path] in compose["volumes"], f"{name}: {mounts[path]} is not a named volume"
    assert environment(services["kafka"])["KAFKA_LOG_DIRS"] == data_paths["kafka"]


def test_kafka_is_a_single_kraft_node_with_internal_and_host_listeners(services: dict[str, dict[str, Any]]) -> None:
    env = environment(services["kafka"])
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
    assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"
    factors = {key: value for key, value in env.items() if key.endswith(("REPLICATION_FACTOR", "MIN_ISR"))}
    assert factors
    assert set(factors.values()) == {"1"}, "one broker: every replication factor and min ISR is 1"
    advertised = dict(item.split("://", 1) for item in env["KAFKA_ADVERTISED_LISTENERS"].split(","))
    assert advertised["PLAINTEXT"] == "kafka:9092"
    assert advertised["EXTERNAL"] == "${PUBLIC_HOST}:${KAFKA_PORT}"
    assert services["kafka"]["ports"] == ["${BIND_ADDRESS}:${KAFKA_PORT}:9094"]
    assert "EXTERNAL://:9094" in env["KAFKA_LISTENERS"].split(",")


def test_connect_worker_reads_secrets_only_from_run_secrets() -> None:
    worker = read_properties(ROOT / "docker" / "connect" / "connect-distributed.properties")
    assert worker["bootstrap.servers"] == "kafka:9092"
    assert worker["group.id"] == "streamviews-connect"
    assert worker["key.converter.schemas.enable"] == worker["value.converter.schemas.enable"] == "false"
    assert worker["plugin.discovery"] == "service_load"
    assert worker["offset.flush.interval.ms"] == "10000"
    for topic in ("config", "offset", "status"):
        assert worker[f"{topic}.storage.replication.factor"] == "1"
    assert worker["config.providers"] == "file,dir"
    for provider in ("file", "dir"):
        assert worker[f"config.providers.{provider}.param.allowed.paths"] == "/run/secrets"
    dockerfile = (ROOT / "docker" / "connect" / "Dockerfile").read_text()
    assert f"/plugins {worker['plugin.path']}" in dockerfile


def test_postgres_is_configured_for_timescaledb_and_logical_decoding(services: dict[str, dict[str, Any]]) -> None:
    conf = {
        key.strip(): value.split("#", 1)[0].strip().strip("'")
        for key, value in (
            line.split("=", 1)
            for line in (ROOT / "docker" / "postgres" / "postgresql.conf").read_text().splitlines()
            if "=" in line and not line.lstrip().startswith("#")
        )
    }
    assert conf["wal_level"] == "logical"
    assert "timescaledb" in conf["shared_preload_libraries"].split(",")
    assert conf["password_encryption"] == "scram-sha-256"
    assert "config_file=/etc/postgresql/postgresql.conf" in services["postgres"]["command"]
    assert environment(services["postgres"])["POSTGRES_PASSWORD_FILE"] == "/run/secrets/postgres_password"


def test_python_services_share_one_image_and_use_the_client_settings(
    compose: dict[str, Any], services: dict[str, dict[str, Any]], python_services: dict[str, dict[str, Any]]
) -> None:
    shared = compose["x-pipeline"]
    assert "dbsetup" in python_services
    for name, service in python_services.items():
        assert service["build"] == shared["build"], f"{name} must reuse x-pipeline"
        env = environment(service)
        assert set(env) <= CLIENT_SETTINGS, f"{name}: unknown settings {sorted(set(env) - CLIENT_SETTINGS)}"
        assert env["SECRETS_DIR"] == "/run/secrets"
    assert environment(services["dbsetup"])["PGUSER"] == "postgres"
    assert set(services["dbsetup"]["secrets"]) == SECRET_NAMES - {
        "elastic_password",
        "kibana_password",
        "connect_password",
        "grafana_password",
    }


def test_each_python_service_holds_only_the_password_of_its_own_role(
    python_services: dict[str, dict[str, Any]],
) -> None:
    roles = {}
    for name, service in python_services.items():
        if name == "dbsetup":
            continue
        role = environment(service).get("PGUSER")
        roles[name] = role
        passwords = {secret for secret in service.get("secrets", []) if secret.startswith(("pg_", "postgres"))}
        assert passwords == ({secret_file_name(role)} if role else set()), f"{name} runs as {role}"
    assert {name: roles[name] for name in ("streams", "audit", "ctid-puller")} == {
        "streams": "sv_writer",
        "audit": "sv_writer",
        "ctid-puller": "sv_indexer",
    }


def test_only_the_services_that_talk_to_elasticsearch_hold_its_password(
    python_services: dict[str, dict[str, Any]],
) -> None:
    holders = {name for name, svc in python_services.items() if "elastic_password" in svc.get("secrets", [])}

    assert holders == {"ctid-puller", "kibana-objects"}


def test_every_heartbeat_file_is_the_one_its_healthcheck_reads(python_services: dict[str, dict[str, Any]]) -> None:
    beating = {name: svc for name, svc in python_services.items() if svc.get("restart") != "no"}
    assert {"streams", "audit", "ctid-puller"} <= beating.keys()
    for name, service in beating.items():
        heartbeat = environment(service).get("PIPELINE_HEARTBEAT_FILE")
        assert heartbeat, f"{name} is long-running: its loop must touch a heartbeat file"
        assert heartbeat in " ".join(service["healthcheck"]["test"]), f"{name} checks another file"


def test_the_search_puller_starts_once_the_database_kafka_and_elasticsearch_are_ready(
    services: dict[str, dict[str, Any]],
) -> None:
    puller = services["ctid-puller"]

    assert puller["command"] == ["python", "-m", "pipelines.audit.puller"]
    assert environment(puller)["ES_URL"] == "http://elasticsearch:9200"
    assert puller["depends_on"] == {
        "dbsetup": {"condition": "service_completed_successfully"},
        "kafka": {"condition": "service_healthy"},
        "elasticsearch": {"condition": "service_healthy"},
    }


def test_prometheus_scrapes_each_long_running_pipeline_on_its_own_metrics_port(
    python_services: dict[str, dict[str, Any]],
) -> None:
    config = yaml.safe_load((ROOT / "monitoring" / "prometheus.yml").read_text())
    scraped = {sd["names"][0]: sd["port"] for job in config["scrape_configs"] for sd in job.get("dns_sd_configs", [])}
    long_running = {name for name, svc in python_services.items() if svc.get("restart") != "no"}
    assert scraped.keys() == long_running
    assert len(set(scraped.values())) == len(scraped), "one port per service"
    for name in long_running:
        env = environment(python_services[name])
        assert env["METRICS_HOST"] == "0.0.0.0", f"{name}: scraped from another container"  # noqa: S104
        assert int(env["METRICS_PORT"]) == scraped[name], name
        assert "ports" not in python_services[name], f"{name}: metrics stay on the compose network"


def test_kibana_objects_are_imported_once_kibana_is_healthy(services: dict[str, dict[str, Any]]) -> None:
    job = services["kibana-objects"]

    assert job["command"] == ["python", "-m", "pipelines.audit.kibana", "import"]
    assert job["restart"] == "no"
    assert environment(job)["KIBANA_URL"] == "http://kibana:5601"
    assert job["depends_on"] == {"kibana": {"condition": "service_healthy"}}
