"""Settings come from the environment with documented defaults; secrets come from files and never show."""

from __future__ import annotations

import pytest

from pipelines.settings import (
    ElasticsearchSettings,
    KafkaSettings,
    LogSettings,
    PostgresSettings,
    secret_file_name,
)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch):
    for name in (
        "PGHOST",
        "PGPORT",
        "PGUSER",
        "PGPASSWORD",
        "PGDATABASE",
        "SECRETS_DIR",
        "KAFKA_BOOTSTRAP_SERVERS",
        "ES_URL",
        "ES_PASSWORD",
        "LOG_FORMAT",
        "LOG_LEVEL",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def secrets(tmp_path, monkeypatch):
    (tmp_path / "pg_writer_password").write_text("writer-secret")
    (tmp_path / "pg_reader_password").write_text("reader-secret\n")
    (tmp_path / "elastic_password").write_text("elastic-secret")
    monkeypatch.setenv("SECRETS_DIR", str(tmp_path))
    return tmp_path


def test_defaults_point_at_the_local_stack():
    pg = PostgresSettings()
    assert (pg.host, pg.port, pg.database, pg.user) == ("127.0.0.1", 5432, "streamviews", "sv_writer")
    assert KafkaSettings().bootstrap_servers == "127.0.0.1:9092"
    assert ElasticsearchSettings().url == "http://127.0.0.1:9200"


def test_libpq_variable_names_configure_postgres(monkeypatch):
    monkeypatch.setenv("PGHOST", "db.internal")
    monkeypatch.setenv("PGPORT", "6543")
    monkeypatch.setenv("PGUSER", "sv_reader")
    monkeypatch.setenv("PGPASSWORD", "from-env")

    pg = PostgresSettings()

    assert (pg.host, pg.port, pg.user, pg.password.get_secret_value()) == ("db.internal", 6543, "sv_reader", "from-env")


def test_a_wrongly_typed_setting_is_rejected(monkeypatch):
    monkeypatch.setenv("PGPORT", "not-a-port")
    with pytest.raises(ValueError, match="port"):
        PostgresSettings()


def test_passwords_come_from_the_secrets_folder_when_not_in_the_environment(secrets):
    assert PostgresSettings().password.get_secret_value() == "writer-secret"
    assert ElasticsearchSettings().basic_auth() == ("elastic", "elastic-secret")


def test_an_empty_password_variable_counts_as_unset(secrets, monkeypatch):
    monkeypatch.setenv("PGPASSWORD", "")
    assert PostgresSettings().password.get_secret_value() == "writer-secret"


def test_connecting_as_another_role_uses_that_roles_password(secrets):
    conninfo = PostgresSettings().conninfo(user="sv_reader")
    assert "user=sv_reader" in conninfo
    assert "password=reader-secret" in conninfo
    assert "writer-secret" not in conninfo


def test_described_settings_redact_secrets(secrets):
    described = PostgresSettings().describe()
    assert described["password"] == "**********"
    assert "writer-secret" not in repr(described)
    assert "elastic-secret" not in repr(ElasticsearchSettings().describe())


def test_secret_files_are_named_after_the_role():
    assert secret_file_name("sv_writer") == "pg_writer_password"
    assert secret_file_name("postgres") == "postgres_password"


def test_log_format_defaults_to_the_terminal_and_can_be_forced(monkeypatch):
    assert LogSettings().format is None
    monkeypatch.setenv("LOG_FORMAT", "json")
    assert LogSettings().format == "json"
    monkeypatch.setenv("LOG_FORMAT", "xml")
    with pytest.raises(ValueError, match="format"):
        LogSettings()


def test_env_sample_lists_every_setting_of_every_component():
    from pathlib import Path

    from pipelines.settings import AuditSettings, ConnectSettings, KibanaSettings, PipelineSettings
    from stack.settings import StackSettings

    sample = (Path(__file__).resolve().parents[2] / ".env.sample").read_text()
    listed = {line.split("=", 1)[0] for line in sample.splitlines() if "=" in line and not line.startswith("#")}
    for settings in (
        PostgresSettings,
        KafkaSettings,
        ElasticsearchSettings,
        ConnectSettings,
        LogSettings,
        PipelineSettings,
        AuditSettings,
        KibanaSettings,
        StackSettings,
    ):
        prefix = settings.model_config.get("env_prefix", "")
        for name, field in settings.model_fields.items():
            variable = field.validation_alias if isinstance(field.validation_alias, str) else prefix + name
            assert variable.upper() in listed, f"{settings.__name__}.{name}: {variable.upper()} not in .env.sample"
