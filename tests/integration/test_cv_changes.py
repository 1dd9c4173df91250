"""Changing a view's definition on a running system: CREATE OR REPLACE, ALTER ... SET (ttl), DROP."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from pipelines.cv import catalog
from pipelines.cv.engine import StreamMaintainer
from pipelines.cv.model import DefinitionError
from tests.integration.conftest import apply_rows, throwaway_views, unique

NOW = datetime.now(UTC)


@pytest.fixture(scope="module")
def streams(stack, pg):
    name = unique("chg")
    keyed, append = f"{name}_likes", f"{name}_clicks"
    definitions = f"""
        CREATE STREAM {keyed} (oid bigint, uid bigint, ts timestamptz) WITH (topic = '{keyed}', key = 'oid, uid');
        CREATE STREAM {append} (url text, ms int, ts timestamptz) WITH (topic = '{append}');
        CREATE CONTINUOUS VIEW {name}.likes AS SELECT oid, count(*) AS n FROM {keyed} GROUP BY oid;
        CREATE CONTINUOUS VIEW {name}.clicks AS SELECT url, count(*) AS n, sum(ms) AS total FROM {append} GROUP BY url;
        CREATE CONTINUOUS VIEW {name}.hourly WITH (ttl = '30 days') AS
            SELECT url, date_trunc('hour', ts) AS hour, count(*) AS n FROM {append} GROUP BY url, hour;
    """
    with throwaway_views(pg, name, [keyed, append], definitions):
        yield {"schema": name, "keyed": keyed, "append": append}


@pytest.fixture
def owner(pg, streams):
    with pg("sv_owner", autocommit=True) as conn:
        yield conn


def test_or_replace_rebuilds_a_keyed_streams_view_from_its_state(owner, writer, streams):
    schema, keyed = streams["schema"], streams["keyed"]
    apply_rows(writer, keyed, [1, 1, 1], [(1, 10, NOW), (1, 11, NOW), (2, 10, NOW)])

    [outcome] = catalog.define(
        owner,
        f"CREATE OR REPLACE CONTINUOUS VIEW {schema}.likes AS"
        f" SELECT oid, count(*) AS n, array_agg(DISTINCT uid) AS users FROM {keyed} GROUP BY oid",
    )

    assert "rebuilt; backfilled 2 groups" in outcome
    rows = writer.execute(f"SELECT oid, n, users FROM {schema}.likes WHERE oid IN (1, 2) ORDER BY oid").fetchall()
    assert [(oid, n, sorted(users)) for oid, n, users in rows] == [(1, 2, [10, 11]), (2, 1, [10])]
    apply_rows(writer, keyed, [-1], [(1, 10, NOW)])  # and it is maintained from there on
    assert writer.execute(f"SELECT n, users FROM {schema}.likes WHERE oid = 1").fetchone() == (1, [11])


def test_or_replace_changes_only_the_read_view_when_the_storage_is_the_same(owner, writer, streams):
    schema, append = streams["schema"], streams["append"]
    apply_rows(writer, append, [1, 1], [("/a", 10, NOW), ("/a", 30, NOW)])

    [outcome] = catalog.define(
        owner,
        f"CREATE OR REPLACE CONTINUOUS VIEW {schema}.clicks AS"
        f" SELECT url, sum(ms) / count(*) AS mean, count(*) AS n FROM {append} GROUP BY url",
    )

    assert "storage is unchanged" in outcome
    assert writer.execute(f"SELECT * FROM {schema}.clicks WHERE url = '/a'").fetchone() == ("/a", 20, 2)


def test_or_replace_without_backfill_refuses_to_rebuild_from_an_append_only_stream_and_says_why(owner, streams):
    schema, append = streams["schema"], streams["append"]
    with pytest.raises(DefinitionError, match=r"cannot rebuild it without a backfill from .* retained history"):
        catalog.define(
            owner,
            f"CREATE OR REPLACE CONTINUOUS VIEW {schema}.clicks WITH (backfill = 'none') AS"
            f" SELECT url, max(ms) AS m FROM {append} GROUP BY url",
        )


def test_a_changed_definition_without_or_replace_is_refused(owner, streams):
    with pytest.raises(DefinitionError, match="CREATE OR REPLACE"):
        catalog.define(
            owner,
            f"CREATE CONTINUOUS VIEW {streams['schema']}.likes AS"
            f" SELECT oid, count(*) AS likes FROM {streams['keyed']} GROUP BY oid",
        )


def test_alter_changes_the_ttl_that_expiry_applies(owner, streams):
    view = f"{streams['schema']}.hourly"
    assert catalog.define(owner, f"ALTER CONTINUOUS VIEW {view} SET (ttl = '7 days')") == [
        f"view {view} altered: ttl '7 days'"
    ]
    definition = owner.execute("SELECT definition FROM cv.views WHERE name = %s", (view,)).fetchone()[0]
    assert "ttl = '7 days'" in definition

    with pytest.raises(DefinitionError, match="positive"):
        catalog.define(owner, f"ALTER CONTINUOUS VIEW {view} SET (ttl = '-1 day')")
    with pytest.raises(DefinitionError, match="not an interval"):
        catalog.define(owner, f"ALTER CONTINUOUS VIEW {view} SET (ttl = 'soon')")
    with pytest.raises(DefinitionError, match="cannot be changed"):
        catalog.define(owner, f"ALTER CONTINUOUS VIEW {view} SET (retention = '1 day')")


def test_alter_sets_a_ttl_by_any_timestamp_column_and_reset_removes_it(owner, writer, streams):
    # PipelineDB's set_ttl(view, ttl, ttl_column) on a view defined without one.
    view = f"{streams['schema']}.recent_rows"
    catalog.define(
        owner, f"CREATE CONTINUOUS VIEW {view} WITH (backfill = 'none') AS SELECT ts, url FROM {streams['append']}"
    )
    try:
        with pytest.raises(DefinitionError, match="ttl_column 'url' must be"):
            catalog.define(owner, f"ALTER CONTINUOUS VIEW {view} SET (ttl = '1 hour', ttl_column = 'url')")
        catalog.define(owner, f"ALTER CONTINUOUS VIEW {view} SET (ttl = '1 hour', ttl_column = 'ts')")
        apply_rows(writer, streams["append"], [1, 1], [("old", 1, NOW - timedelta(hours=2)), ("new", 1, NOW)])
        with writer.transaction():  # a row already past the ttl is not kept, or expires here
            StreamMaintainer(streams["append"]).expire(writer)
        assert [u for (u,) in owner.execute(f"SELECT url FROM {view}")] == ["new"]

        catalog.define(owner, f"ALTER CONTINUOUS VIEW {view} RESET (ttl, ttl_column)")
        apply_rows(writer, streams["append"], [1], [("old", 1, NOW - timedelta(hours=2))])
        with writer.transaction():
            StreamMaintainer(streams["append"]).expire(writer)
        assert sorted(u for (u,) in owner.execute(f"SELECT url FROM {view}")) == ["new", "old"]
    finally:
        catalog.drop(owner, [view], "view")


def test_drop_statements_drop_views_and_streams_and_if_exists_skips_missing_ones(owner, streams):
    schema, name = streams["schema"], unique("gone")
    catalog.define(owner, f"CREATE STREAM {name} (a bigint) WITH (topic = '{name}')")
    catalog.define(owner, f"CREATE CONTINUOUS VIEW {schema}.{name} AS SELECT a, count(*) AS n FROM {name} GROUP BY a")
    with pytest.raises(DefinitionError, match="no continuous view named"):
        catalog.define(owner, f"DROP CONTINUOUS VIEW {schema}.{name}, {schema}.nope_x")
    assert owner.execute("SELECT to_regclass(%s)", (f"{schema}.{name}",)).fetchone() != (None,)  # nothing dropped

    outcome = catalog.define(owner, f"DROP CONTINUOUS VIEW IF EXISTS {schema}.{name}, {schema}.nope_x")
    assert outcome == [f"view {schema}.{name} dropped; view {schema}.nope_x does not exist; skipped"]
    assert catalog.define(owner, f"DROP STREAM {name}") == [f"stream {name} dropped"]
    assert owner.execute("SELECT to_regclass(%s)", (f"{schema}.{name}",)).fetchone() == (None,)


def test_a_script_is_applied_all_or_nothing_and_a_failed_statement_is_named(owner, streams):
    schema, name = streams["schema"], unique("script")
    view = f"CREATE CONTINUOUS VIEW {schema}.{name} AS SELECT a, count(*) AS n FROM {name} GROUP BY a"
    stream = f"CREATE STREAM {name} (a bigint) WITH (topic = '{name}')"
    with pytest.raises(DefinitionError, match=r"^statement 3 \(line 3\): no stream named nope_"):
        catalog.define(owner, f"{stream};\n{view};\nDROP STREAM nope_{name}")
    assert owner.execute("SELECT count(*) FROM cv.streams WHERE name = %s", (name,)).fetchone() == (0,)
    assert owner.execute("SELECT to_regclass(%s)", (f"{schema}.{name}",)).fetchone() == (None,)

    # The view is read against the stream the statement before it declared.
    assert catalog.define(owner, f"{stream};\n{view}")[0] == f"stream {name} created"
    assert catalog.define(owner, f"{stream}; {view}") == [f"stream {name} unchanged", f"view {schema}.{name} unchanged"]
    catalog.define(owner, f"DROP CONTINUOUS VIEW {schema}.{name}; DROP STREAM {name}")


def test_every_drop_resolves_names_the_same_way(owner, streams):
    schema, name = streams["schema"], unique("dropped")
    catalog.define(
        owner,
        f"CREATE STREAM {name} (a bigint) WITH (topic = '{name}');"
        f" CREATE CONTINUOUS VIEW public.{name} AS SELECT a, count(*) AS n FROM {name} GROUP BY a",
    )
    with pytest.raises(DefinitionError, match=f"{name} is both a stream and the continuous view public.{name}"):
        catalog.drop(owner, [name])
    with pytest.raises(DefinitionError, match=f"no continuous view named public.nope_{name}"):
        catalog.drop(owner, [f"nope_{name}"], "view")
    with pytest.raises(DefinitionError, match=f"no continuous view named public.nope_{name}"):
        catalog.define(owner, f"DROP CONTINUOUS VIEW nope_{name}")
    with pytest.raises(DefinitionError, match=f"no stream, continuous view, transform or sink named {schema}.{name}"):
        catalog.drop(owner, [f"{schema}.{name}"])
    # `public.x` can only be the view; once it is dropped, `x` is only the stream: one transaction.
    assert catalog.drop(owner, [f"public.{name}", name]) == [f"view public.{name} dropped", f"stream {name} dropped"]
    assert owner.execute("SELECT count(*) FROM cv.streams WHERE name = %s", (name,)).fetchone() == (0,)
