"""Migrations are numbered files applied in order; a misnamed or duplicate one is refused."""

from __future__ import annotations

import pytest

from pipelines.dbsetup import SQL_DIR, load_migrations
from pipelines.errors import DatabaseSetupError


def test_the_projects_migrations_are_numbered_and_each_explains_why():
    migrations = load_migrations()
    assert [m.version for m in migrations] == sorted(m.version for m in migrations)
    for migration in migrations:
        assert migration.text.lstrip().startswith("-- why:"), f"{migration.version} has no '-- why:' opening"


def test_files_load_in_version_order(tmp_path):
    (tmp_path / "0002_second.sql").write_text("SELECT 2")
    (tmp_path / "0001_first.sql").write_text("SELECT 1")
    assert [(m.version, m.name) for m in load_migrations(tmp_path)] == [("0001", "first"), ("0002", "second")]


def test_a_changed_text_changes_the_checksum(tmp_path):
    path = tmp_path / "0001_first.sql"
    path.write_text("SELECT 1")
    before = load_migrations(tmp_path)[0].checksum
    path.write_text("SELECT 1 -- edited")
    assert load_migrations(tmp_path)[0].checksum != before


@pytest.mark.parametrize("name", ["first.sql", "0001.sql", "v1_first.sql"])
def test_a_misnamed_migration_is_refused(tmp_path, name):
    (tmp_path / name).write_text("SELECT 1")
    with pytest.raises(DatabaseSetupError, match="NNNN_description"):
        load_migrations(tmp_path)


def test_duplicate_versions_are_refused(tmp_path):
    (tmp_path / "0001_a.sql").write_text("SELECT 1")
    (tmp_path / "0001_b.sql").write_text("SELECT 1")
    with pytest.raises(DatabaseSetupError, match="duplicate"):
        load_migrations(tmp_path)


def test_extensions_are_installed_idempotently():
    statements = [line for line in (SQL_DIR / "extensions.sql").read_text().splitlines() if "CREATE EXTENSION" in line]
    assert statements
    assert all("IF NOT EXISTS" in line for line in statements)
