"""Readers of a view's change stream (migration 0023): a sink or a view over the view takes its changes.

A reader starts after the view's last position, keeps the view recording whatever the view's own
`changes` option says, holds back retention of the changes it has not taken, and keeps the view from
being dropped under it.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipelines.cv import catalog
from pipelines.cv.catalog import change_streams, store
from pipelines.cv.model import DefinitionError
from tests.integration.conftest import apply_rows, throwaway_views, unique

NOW = datetime.now(UTC)


@pytest.fixture(scope="module")
def streams(stack, pg):
    name = unique("readers")
    clicks = f"{name}_clicks"
    definitions = f"""
        CREATE STREAM {clicks} (url text, ts timestamptz) WITH (topic = '{clicks}');
        CREATE CONTINUOUS VIEW {name}.counts AS SELECT url, count(*) AS n FROM {clicks} GROUP BY url;
    """
    with throwaway_views(pg, name, [clicks], definitions):
        yield {"view": f"{name}.counts", "stream": clicks}


def stored(conn, name):
    definition, types = conn.execute("SELECT definition, types FROM cv.views WHERE name = %s", (name,)).fetchone()
    compiled = store.stored_view(definition, types, store.scope(conn))
    return compiled.view, compiled.types


def test_a_reader_turns_recording_on_starts_after_the_last_position_and_keeps_it_on(pg, writer, streams):
    view_name, stream = streams["view"], streams["stream"]
    with pg("sv_owner") as owner:
        view, types = stored(owner, view_name)
        assert not change_streams.is_recording(owner, view_name)
        assert change_streams.add_reader(owner, view, types, "sink test") == 0
        owner.commit()
        apply_rows(writer, stream, [1, 1], [("a", NOW), ("b", NOW)])
        assert (
            owner.execute("SELECT last FROM cv.view_change_positions WHERE view = %s", (view_name,)).fetchone()[0] == 2
        )
        # The view's own option says no changes: its reader keeps them recorded.
        change_streams.follow_option(owner, view, types)
        assert change_streams.is_recording(owner, view_name)
        with pytest.raises(DefinitionError, match="already reads"):
            change_streams.add_reader(owner, view, types, "sink test")
        owner.rollback()
        with pytest.raises(DefinitionError, match="sink test read its changes; drop them first"):
            catalog.drop(owner, [view_name], "view")
        change_streams.remove_reader(owner, view, "sink test")
        assert not change_streams.is_recording(owner, view_name)
        owner.commit()


def test_retention_keeps_the_changes_a_reader_has_not_taken(pg, writer, streams):
    view_name, stream = streams["view"], streams["stream"]
    with pg("sv_owner") as owner:
        view, types = stored(owner, view_name)
        start = change_streams.add_reader(owner, view, types, "sink slow")
        owner.commit()
        apply_rows(writer, stream, [1, 1, 1], [("x", NOW), ("y", NOW), ("z", NOW)])
        # The reader took the first of the three; every change is older than a zero retention.
        owner.execute(
            "UPDATE cv.change_readers SET position = %s WHERE view = %s AND reader = 'sink slow'",
            (start + 1, view_name),
        )
        pruned = owner.execute("SELECT cv.prune_view_changes('0 seconds')").fetchone()[0]
        left = owner.execute(
            "SELECT array_agg(position ORDER BY position) FROM cv.view_changes WHERE view = %s", (view_name,)
        ).fetchone()[0]
        assert left == [start + 2, start + 3]
        assert pruned >= 1
        owner.rollback()
        change_streams.remove_reader(owner, view, "sink slow")
        owner.commit()
