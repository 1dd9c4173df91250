"""Plain SQL DDL cannot leave a continuous view half-dropped (sql/guards.sql's event triggers).

A continuous view is a catalog row, storage tables in schema cv and a read view; DROP VIEW, DROP
SCHEMA ... CASCADE, ALTER SCHEMA / VIEW ... RENAME, SET SCHEMA or DROP TABLE cv.<storage> typed in
psql would reach only part of it. A stream's insert relation `streams.<stream>` is made from the
stream's declaration: a DROP VIEW, DROP TRIGGER or any ALTER of it by hand would break INSERT INTO
the stream behind the catalog's back. Each is refused in one line naming `streamviews drop` or ALTER
STREAM, and leaves the view and the stream whole; the catalog's own DDL (CREATE / ALTER / DROP
STREAM too) and every unrelated statement pass.
"""

from __future__ import annotations

import threading

import psycopg
import pytest

from pipelines.cv import catalog
from pipelines.dbsetup import SQL_DIR
from tests.integration.conftest import throwaway_views, unique, wait_for


@pytest.fixture
def cv(pg):
    """A continuous view, a transform and a keyed stream's state in a schema of their own.

    The streams' consumer group is one no supervised runner runs: nothing here needs events.
    """
    name = unique("ddlg")
    stream, keyed = f"{name}_e", f"{name}_k"
    group = f"it-{name}"
    definitions = f"""
        CREATE STREAM {stream} (k bigint, n bigint) WITH (topic = '{stream}', consumer_group = '{group}');
        CREATE STREAM {keyed} (k bigint, n bigint) WITH (topic = '{keyed}', key = 'k', consumer_group = '{group}');
        CREATE CONTINUOUS VIEW {name}.per_k AS SELECT k, count(*) AS n FROM {stream} GROUP BY k;
        CREATE CONTINUOUS TRANSFORM {name}.t AS SELECT k FROM {stream};
    """
    with throwaway_views(pg, name, [stream, keyed], definitions):
        yield {"schema": name, "view": f"{name}.per_k", "transform": f"{name}.t", "keyed": keyed, "stream": stream}


def refused(pg, statement: str) -> psycopg.Error:
    """The error PostgreSQL answered `statement` with, as the owner, in a transaction rolled back in any case."""
    with pg("sv_owner") as conn:
        try:
            with pytest.raises(psycopg.Error) as caught:
                conn.execute(statement)
        finally:
            conn.rollback()
    return caught.value


def insert_relation(conn: psycopg.Connection, stream: str) -> list[tuple[str, str | None]]:
    """The columns of `streams.<stream>` and their defaults; none when it is not there."""
    return conn.execute(
        "SELECT a.attname, pg_get_expr(d.adbin, d.adrelid) FROM pg_attribute a"
        " LEFT JOIN pg_attrdef d ON (d.adrelid, d.adnum) = (a.attrelid, a.attnum)"
        " WHERE a.attrelid = to_regclass(%s) AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
        (f"streams.{stream}",),
    ).fetchall()


def assert_whole(pg, cv) -> None:
    """The view and the transform are in the catalog and readable, their storage and state still there.

    And the stream's insert relation takes an INSERT as declared (rolled back: no event is queued).
    """
    with pg("sv_owner") as conn:
        assert insert_relation(conn, cv["stream"]) == [("k", None), ("n", None)]
        assert conn.execute(f"INSERT INTO streams.{cv['stream']} (k, n) VALUES (1, 2)").rowcount == 1
        conn.rollback()
    with pg("sv_owner", autocommit=True) as conn:
        for name, table in ((cv["view"], "views"), (cv["transform"], "transforms")):
            assert conn.execute(f"SELECT 1 FROM cv.{table} WHERE name = %s", (name,)).fetchone(), name
            conn.execute(f"SELECT * FROM {name}").fetchall()
        storage = f"cv.{cv['schema']}__per_k"
        assert (
            None
            not in conn.execute(
                "SELECT to_regclass(%s), to_regclass(%s)", (storage, f"cv.state_{cv['keyed']}")
            ).fetchone()
        )


REFUSED = {
    "DROP VIEW": (
        "DROP VIEW {view}",
        "2BP01",
        '{view} is a continuous view: drop it with "streamviews drop {view}" (DROP VIEW would drop only its read view)',
    ),
    "DROP VIEW of a transform": (
        "DROP VIEW {transform}",
        "2BP01",
        '{transform} is a continuous transform: drop it with "streamviews drop {transform}"'
        " (DROP VIEW would drop only its read view)",
    ),
    "DROP SCHEMA CASCADE": (
        "DROP SCHEMA {schema} CASCADE",
        "2BP01",
        "schema {schema} holds continuous views and transforms ({view}, {transform}):"
        ' drop them first with "streamviews drop {view} {transform}"',
    ),
    "ALTER SCHEMA RENAME": (
        "ALTER SCHEMA {schema} RENAME TO {schema}_2",
        "0A000",
        "renaming schema {schema} is not supported while it holds continuous views ({view}, {transform}):"
        ' drop them with "streamviews drop {view} {transform}" first, and define them again in the renamed schema',
    ),
    "ALTER VIEW RENAME": (
        "ALTER VIEW {view} RENAME TO other",
        "0A000",
        "{view} is a continuous view: ALTER VIEW cannot rename it or move it to another schema (the catalog"
        ' knows it by its name); drop it with "streamviews drop {view}" and define it again under the new name',
    ),
    "ALTER VIEW SET SCHEMA": (
        "ALTER VIEW {view} SET SCHEMA public",
        "0A000",
        "{view} is a continuous view: ALTER VIEW cannot rename it or move it to another schema",
    ),
    "ALTER TABLE RENAME of a transform's read view": (
        "ALTER TABLE {transform} RENAME TO other",
        "0A000",
        "{transform} is a continuous transform: ALTER TABLE cannot rename it",
    ),
    "DROP TABLE of the storage, CASCADE": (
        "DROP TABLE cv.{schema}__per_k CASCADE",
        "2BP01",
        'cv.{schema}__per_k is a storage table of continuous view {view}: drop the view with "streamviews drop'
        ' {view}" (DROP TABLE would leave the view without its storage)',
    ),
    "DROP TABLE of a stream's state": (
        "DROP TABLE cv.state_{keyed}",
        "2BP01",
        'cv.state_{keyed} is the state of stream {keyed}: drop the stream with "streamviews drop {keyed}"',
    ),
    "ALTER TABLE RENAME of the storage": (
        "ALTER TABLE cv.{schema}__per_k RENAME TO other",
        "0A000",
        "cv.{schema}__per_k is a storage table of continuous view {view}: ALTER TABLE cannot rename it",
    ),
    "DROP VIEW of a stream's insert relation": (
        "DROP VIEW streams.{stream}",
        "2BP01",
        'streams.{stream} is the insert relation of stream {stream}: drop the stream with "streamviews drop {stream}"'
        " (DROP VIEW would leave the stream without its insert relation)",
    ),
    "DROP TRIGGER of a stream's insert relation": (
        "DROP TRIGGER stream_insert ON streams.{stream}",
        "2BP01",
        "trigger stream_insert on streams.{stream} writes the rows inserted into stream {stream}: drop the stream"
        ' with "streamviews drop {stream}" (DROP TRIGGER would leave the stream without its insert trigger)',
    ),
    "ALTER VIEW RENAME of a stream's insert relation": (
        "ALTER VIEW streams.{stream} RENAME TO other",
        "0A000",
        "streams.{stream} is the insert relation of stream {stream}: ALTER VIEW cannot change it (the catalog"
        ' makes it from the stream\'s declaration); change the stream with "ALTER STREAM {stream} ...", or drop'
        ' it with "streamviews drop {stream}" and declare it again',
    ),
    "ALTER VIEW SET SCHEMA of a stream's insert relation": (
        "ALTER VIEW streams.{stream} SET SCHEMA {schema}",
        "0A000",
        "streams.{stream} is the insert relation of stream {stream}: ALTER VIEW cannot change it",
    ),
    "ALTER VIEW SET DEFAULT on a stream's insert relation": (
        "ALTER VIEW streams.{stream} ALTER COLUMN n SET DEFAULT 7",
        "0A000",
        "streams.{stream} is the insert relation of stream {stream}: ALTER VIEW cannot change it",
    ),
    "ALTER TABLE RENAME COLUMN of a stream's insert relation": (
        "ALTER TABLE streams.{stream} RENAME COLUMN n TO m",
        "0A000",
        "streams.{stream} is the insert relation of stream {stream}: ALTER TABLE cannot change it",
    ),
    "ALTER SCHEMA streams RENAME": (
        "ALTER SCHEMA streams RENAME TO streams_2",
        "0A000",
        "renaming schema streams is not supported: it holds the insert relations of streams (",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_plain_ddl_reaching_part_of_a_continuous_view_is_refused_in_one_line_and_changes_nothing(pg, cv, case):
    statement, sqlstate, message = (text.format(**cv) for text in REFUSED[case])
    error = refused(pg, statement)
    assert error.sqlstate == sqlstate
    assert error.diag.message_primary.startswith(message)
    assert "\n" not in error.diag.message_primary
    assert_whole(pg, cv)


def test_the_catalogs_create_alter_and_drop_stream_make_and_drop_its_insert_relation(pg, cv):
    """CREATE STREAM makes streams.<stream>, a redefinition and ALTER STREAM make it again, DROP STREAM drops it."""
    stream, options = f"{cv['schema']}_w", f"consumer_group = 'it-{cv['schema']}'"  # no runner reads it
    declared = f"CREATE STREAM {stream} (k bigint, note text DEFAULT 'none') WITH (topic = '{{}}', {options})"
    with pg("sv_owner", autocommit=True) as conn:
        try:
            catalog.define(conn, declared.format(stream))
            catalog.define(conn, declared.format(f"{stream}_2"))  # how its events are read: made again
            catalog.define(conn, f"ALTER STREAM {stream} ADD COLUMN n bigint DEFAULT 7")
            assert insert_relation(conn, stream) == [("k", None), ("note", "'none'::text"), ("n", "7")]
            catalog.define(conn, f"DROP STREAM {stream}")
            assert insert_relation(conn, stream) == []
        finally:
            catalog.define(conn, f"DROP STREAM IF EXISTS {stream}")


def test_streamviews_drop_still_drops_a_view_and_a_transform_whole(pg, cv):
    with pg("sv_owner", autocommit=True) as conn:
        catalog.drop(conn, [cv["view"], cv["transform"]])
        names = [cv["view"], cv["transform"], f"cv.{cv['schema']}__per_k"]
        assert conn.execute("SELECT to_regclass(%s), to_regclass(%s), to_regclass(%s)", names).fetchone() == (
            None,
            None,
            None,
        )
        assert conn.execute("SELECT count(*) FROM cv.views WHERE name = %s", (cv["view"],)).fetchone() == (0,)


def test_unrelated_ddl_in_the_same_schema_passes(pg, cv):
    schema = cv["schema"]
    with pg("sv_owner", autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {schema}.plain_t (a int)")
        conn.execute(f"CREATE VIEW {schema}.plain AS SELECT a FROM {schema}.plain_t")
        conn.execute(f"ALTER VIEW {schema}.plain RENAME TO plain_2")
        conn.execute(f"ALTER TABLE {schema}.plain_t RENAME TO plain_t2")
        conn.execute(f"DROP VIEW {schema}.plain_2")
        conn.execute(f"DROP TABLE {schema}.plain_t2")
        conn.execute("CREATE TEMP TABLE guard_probe (a int)")  # the engine's per-session tables
        conn.execute("DROP TABLE guard_probe")
        conn.execute(f"TRUNCATE cv.{schema}__per_k")
        conn.execute(f"ALTER SCHEMA {schema} OWNER TO sv_owner")  # an ALTER SCHEMA that renames nothing
        conn.execute(f"GRANT INSERT ON streams.{cv['stream']} TO sv_reader")  # as docs/streams.md says to
        conn.execute(f"COMMENT ON VIEW streams.{cv['stream']} IS 'written by the app'")
    assert_whole(pg, cv)


def test_a_schema_without_continuous_views_is_dropped_and_renamed_as_ever(pg):
    schema = unique("ddlg_plain")
    statements = [
        f"CREATE SCHEMA {schema}",
        f"CREATE TABLE {schema}.t (a int)",
        f"CREATE VIEW {schema}.v AS SELECT a FROM {schema}.t",
        f"ALTER SCHEMA {schema} RENAME TO {schema}_2",
        f"DROP SCHEMA {schema}_2 CASCADE",
    ]
    with pg("sv_owner", autocommit=True) as conn:
        for statement in statements:
            conn.execute(statement)
        assert conn.execute("SELECT to_regnamespace(%s)", (f"{schema}_2",)).fetchone() == (None,)


def test_the_catalogs_own_transaction_is_let_through(pg, cv):
    """What begin_change marks (definitions, replays' swaps) drops read views; so may a session that says so."""
    with pg("sv_owner") as conn:
        conn.execute("SELECT set_config('cv.catalog_ddl', 'on', true)")
        conn.execute(f"DROP VIEW {cv['view']}")
        conn.rollback()
    assert_whole(pg, cv)


def test_drop_owned_reaching_a_continuous_view_is_refused(pg, cv):
    role = unique("ddlg_role")
    with pg("postgres", autocommit=True) as admin:
        admin.execute(f"CREATE ROLE {role}")
        admin.execute(f"ALTER VIEW {cv['view']} OWNER TO {role}")
        try:
            with pytest.raises(psycopg.errors.DependentObjectsStillExist) as caught:
                admin.execute(f"DROP OWNED BY {role}")
        finally:
            admin.execute(f"ALTER VIEW {cv['view']} OWNER TO sv_owner")
            admin.execute(f"DROP ROLE {role}")
    assert caught.value.diag.message_primary == (
        f'DROP OWNED would drop continuous views ({cv["view"]}): drop them first with "streamviews drop {cv["view"]}"'
    )
    assert_whole(pg, cv)


def test_the_runners_temporary_tables_pass(pg):
    """The engine's role makes and drops temporary tables in every session; it cannot read the catalog's reasons."""
    with pg("sv_writer", autocommit=True) as conn:
        conn.execute("CREATE TEMP TABLE IF NOT EXISTS guard_probe (a int) ON COMMIT DELETE ROWS")
        conn.execute("DROP TABLE IF EXISTS guard_probe")


def test_dbsetup_makes_the_guard_again_unchanged_and_enabled(pg):
    """sql/guards.sql runs at every dbsetup: twice in a row it succeeds, and its triggers are on."""
    text = (SQL_DIR / "guards.sql").read_text()
    with pg("postgres", autocommit=True) as admin:
        admin.execute(text)
        admin.execute(text)
        enabled = admin.execute(
            "SELECT evtname, evtenabled FROM pg_event_trigger WHERE evtname LIKE 'streamviews\\_%' ORDER BY evtname"
        ).fetchall()
    assert enabled == [
        ("streamviews_note_relations", "O"),
        ("streamviews_refuse_drops", "O"),
        ("streamviews_refuse_renames", "O"),
    ]


def test_a_session_that_loaded_the_streamviews_library_passes_too(pg, cv):
    """The extension reserves settings named streamviews.*: the guard's own settings are named cv.*."""
    with pg("postgres") as admin:
        admin.execute("LOAD 'streamviews'")
        admin.execute("SELECT set_config('cv.catalog_ddl', 'on', true)")  # as begin_change and the replays say
        admin.execute(f"ALTER VIEW {cv['view']} RENAME TO renamed_by_the_catalog")
        admin.rollback()
        admin.execute(f"CREATE TABLE {cv['schema']}.plain_t (a int)")  # unmarked, unrelated
        admin.execute(f"ALTER TABLE {cv['schema']}.plain_t RENAME TO plain_t2")
        admin.rollback()
    assert_whole(pg, cv)


def test_a_view_dropped_by_another_session_meanwhile_does_not_refuse_an_unrelated_rename(pg, cv):
    """The rename check compares the catalog before and after a statement; what others commit between is theirs."""
    schema = cv["schema"]
    with pg("sv_owner", autocommit=True) as setup:
        setup.execute(f"CREATE TABLE {schema}.plain_t (a int)")
    with pg("sv_owner") as holder, pg("sv_owner", autocommit=True) as renamer, pg("sv_owner", autocommit=True) as other:
        holder.execute(f"LOCK TABLE {schema}.plain_t")  # the rename waits for it after its start noted the catalog
        outcome = []
        statement = f"ALTER TABLE {schema}.plain_t RENAME TO plain_t2"
        renaming = threading.Thread(target=lambda: outcome.append(run(renamer, statement)))
        renaming.start()
        waiting = "SELECT 1 FROM pg_locks WHERE pid = %s AND relation = %s::regclass AND NOT granted"
        wait_for(
            lambda: other.execute(waiting, (renamer.info.backend_pid, f"{schema}.plain_t")).fetchone(),
            what="the rename to wait for the table's lock",
        )
        catalog.drop(other, [cv["view"]])
        holder.commit()
        renaming.join(60)
    assert outcome == [None]


def run(conn: psycopg.Connection, statement: str) -> str | None:
    """Run a statement; PostgreSQL's error message, or None when it succeeded."""
    try:
        conn.execute(statement)
    except psycopg.Error as e:
        return e.diag.message_primary
    return None
