"""CREATE / DROP CONTINUOUS TRANSFORM read by the front end: what a transform is, and what it refuses in one line.

A transform is a per-event SELECT over one append-only stream, maybe joined with a table; whatever
would make it a view (aggregates, GROUP BY, window functions) or make its output ambiguous is refused
naming what, before any database is asked.
"""

from __future__ import annotations

import pytest

from pipelines.cv import status
from pipelines.cv.frontend.statements import NO_SCOPE, parse, read_script
from pipelines.cv.frontend.transforms import (
    DropTransform,
    is_transform,
    parse_drop_transform,
    parse_transform,
    writes_into,
)
from pipelines.cv.model import Column, DefinitionError, Join, JoinedTable, Output, Scope, StreamDef

CLICKS = "CREATE STREAM clicks (url text, uid bigint, ms int, ts timestamptz) WITH (topic = 'clicks')"
LIKES = "CREATE STREAM likes (oid bigint, uid bigint) WITH (topic = 'likes', key = 'oid, uid')"
CDC = "CREATE STREAM app_clicks (url text, uid bigint, ms int, ts timestamptz) WITH (topic = 'cdc', into = 'clicks')"
SCOPE = Scope({s.name: s for s in (parse(t, NO_SCOPE) for t in (CLICKS, LIKES, CDC))}, frozenset({"mode_of"}))


def transform(text: str):
    return parse_transform(text, SCOPE)


def test_a_filter_and_a_projection_over_a_stream():
    t = transform(
        "CREATE CONTINUOUS TRANSFORM public.slow AS SELECT url, ms / 1000.0 AS seconds FROM clicks WHERE ms > 100"
    )
    assert (t.schema, t.name, t.stream) == ("public", "slow", "clicks")
    assert t.outputs == (Output("url", "url"), Output("seconds", "ms / 1000.0"))
    assert t.where_sql == "ms > 100"
    assert t.join is None
    assert t.key is None
    assert t.qualified_name == "public.slow"


def test_the_issues_example_cleaned_and_enriched_events():
    t = transform(
        "CREATE CONTINUOUS TRANSFORM shop.clean WITH (key = 'url, uid') AS"
        " SELECT c.url, c.uid, u.country FROM clicks AS c JOIN shop.users AS u ON u.id = c.uid"
        " WHERE c.url NOT LIKE '/health%'"
    )
    assert t.join == Join("c", (JoinedTable("shop.users", "u", False, "u.id = c.uid"),))
    assert [o.name for o in t.outputs] == ["url", "uid", "country"]
    assert t.key == ("url", "uid")


def test_a_transform_reads_its_from_as_a_view_does_aliases_and_tables_any_way_written():
    t = transform("CREATE CONTINUOUS TRANSFORM a AS SELECT c.url FROM public.clicks AS c WHERE c.ms > 1")
    assert (t.outputs, t.where_sql, t.join) == ((Output("url", "url"),), "ms > 1", None)
    t = transform(
        "CREATE CONTINUOUS TRANSFORM b AS SELECT c.url, u.country, g.region FROM shop.users u"
        " JOIN clicks c ON u.id = c.uid LEFT JOIN shop.geo g ON g.country = u.country"
    )
    assert t.join == Join(
        "c",
        (
            JoinedTable("shop.users", "u", False, "u.id = c.uid"),
            JoinedTable("shop.geo", "g", True, "g.country = u.country"),
        ),
    )


def test_pipelinedbs_spelling_maps_onto_the_same_transform():
    text = "CREATE VIEW slow WITH (action = transform) AS SELECT url FROM clicks WHERE ms > 100"
    assert is_transform(text)
    assert is_transform(text.replace("transform", "'transform'"))
    assert not is_transform("CREATE VIEW v AS SELECT url FROM clicks")
    assert not is_transform("CREATE CONTINUOUS VIEW v AS SELECT url, count(*) FROM clicks GROUP BY url")
    t = transform(text)
    assert (t.qualified_name, t.outputs, t.where_sql) == ("public.slow", (Output("url", "url"),), "ms > 100")


@pytest.mark.parametrize(
    ("query", "says"),
    [
        ("SELECT url, count(*) AS n FROM clicks", "aggregates are not allowed"),
        ("SELECT url FROM clicks WHERE mode_of(uid) > 1", "aggregates are not allowed"),
        ("SELECT url FROM clicks GROUP BY url", "GROUP BY: a transform aggregates nothing"),
        ("SELECT url, row_number() OVER () AS n FROM clicks", "window functions are not supported"),
        ("SELECT url FROM clicks HAVING true", "HAVING is not supported"),
        ("SELECT DISTINCT url FROM clicks", "SELECT DISTINCT is not supported"),
        ("SELECT url FROM clicks ORDER BY url", "ORDER BY is not supported"),
        ("SELECT url FROM clicks LIMIT 1", "LIMIT is not supported"),
        ("SELECT * FROM clicks", "SELECT * is not supported"),
        ("SELECT url, ms AS url FROM clicks", "two output columns are named 'url'"),
        ("SELECT url, ms + 1 FROM clicks", "needs a name"),
        ("SELECT ms AS position FROM clicks", "position is the read view's own column"),
        ("SELECT url AS _cv_x FROM clicks", "names starting with _cv_ are the engine's"),
        ("SELECT nope FROM clicks", "nope is not a column of the stream"),
        ("SELECT url FROM clicks WHERE uid IN (SELECT 1)", "subqueries are not supported"),
        ("SELECT url FROM nowhere", "nowhere is not a stream"),
        ("SELECT oid FROM likes", "likes has a key"),
        ("SELECT url FROM app_clicks", "feeds clicks and keeps nothing of its own"),
        ("SELECT url FROM clicks UNION SELECT url FROM clicks", "a single SELECT"),
        ("SELECT x.url FROM clicks c JOIN t ON t.id = c.uid", "x is neither the stream nor a joined table"),
        ("SELECT url FROM clicks WHERE ms > $1", "parameters ($n) are not supported"),
    ],
)
def test_what_a_transform_refuses_in_one_line(query, says):
    with pytest.raises(DefinitionError) as refused:
        transform(f"CREATE CONTINUOUS TRANSFORM t AS {query}")
    assert says in str(refused.value)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize(
    ("statement", "says"),
    [
        ("CREATE OR REPLACE CONTINUOUS TRANSFORM t AS SELECT url FROM clicks", "drop the transform and create"),
        ("CREATE CONTINUOUS TRANSFORM t WITH (key = 'nope') AS SELECT url FROM clicks", "key column 'nope'"),
        ("CREATE CONTINUOUS TRANSFORM t WITH (key = 'url, url') AS SELECT url FROM clicks", "names a column twice"),
        ("CREATE CONTINUOUS TRANSFORM t WITH (ttl = '1 day') AS SELECT url FROM clicks", "unknown option 'ttl'"),
        ('CREATE CONTINUOUS TRANSFORM "T" AS SELECT url FROM clicks', "not a plain lower-case identifier"),
        (
            "CREATE VIEW t WITH (action = transform, outputfunc = ct_tg) AS SELECT url FROM clicks",
            "outputfunc ct_tg: a trigger function per output row is not supported",
        ),
        (
            "CREATE VIEW t WITH (action = transform, outputfunc = pipelinedb.insert_into_stream('nope')) AS"
            " SELECT url FROM clicks",
            "no stream named nope",
        ),
        (
            "CREATE VIEW t WITH (action = transform, outputfunc = pipelinedb.insert_into_stream('clicks')) AS"
            " SELECT url, uid FROM clicks",
            "clicks must have the same columns as the transform: it has 4 (url, uid, ms, ts), the transform outputs 2",
        ),
        (
            "CREATE VIEW t WITH (action = transform, outputfunc = pipelinedb.insert_into_stream(clicks)) AS"
            " SELECT url FROM clicks",
            "insert_into_stream takes the stream's name, quoted",
        ),
    ],
)
def test_options_and_names_a_transform_refuses(statement, says):
    with pytest.raises(DefinitionError) as refused:
        transform(statement)
    assert says in str(refused.value)


def test_drop_continuous_transform():
    assert parse_drop_transform("DROP CONTINUOUS TRANSFORM IF EXISTS a, s.b;") == DropTransform(
        ("public.a", "s.b"), True
    )
    assert parse_drop_transform("DROP CONTINUOUS VIEW a") is None
    with pytest.raises(DefinitionError, match="CASCADE is not supported"):
        parse_drop_transform("DROP CONTINUOUS TRANSFORM a CASCADE")


def test_a_script_holds_transforms_beside_streams_and_views():
    script = read_script(
        f"{CLICKS};\nCREATE CONTINUOUS TRANSFORM t AS SELECT url FROM clicks;\nDROP CONTINUOUS TRANSFORM t;"
    )
    first, create, drop = script.statements
    assert first.stream is not None
    assert first.stream.name == "clicks"
    assert create.change is None
    assert is_transform(create.statement.text)
    assert drop.change == DropTransform(("public.t",), False)


def test_status_lists_each_streams_transforms_with_their_last_position():
    clicks = status.StreamStatus("clicks", "clicks", partitions=1, lag=0, transform_positions={"public.clean": 7})
    text = status.status_table("g", [clicks])
    assert "continuous transforms" in text
    assert ["public.clean", "clicks", "7"] in [line.split() for line in text.splitlines()]
    assert clicks.as_json()["transforms"] == {"public.clean": 7}
    assert "continuous transforms" not in status.status_table("g", [status.StreamStatus("clicks", "clicks")])


def test_insert_into_stream_writes_each_output_row_into_a_stream_by_position():
    t = transform(
        "CREATE VIEW public.copy WITH (action = transform, outputfunc = pipelinedb.insert_into_stream('clicks')) AS"
        " SELECT lower(url) AS u, uid + 1 AS id, ms, ts FROM clicks WHERE ms > 100"
    )
    assert t.into == ("clicks", ("url", "uid", "ms", "ts"))
    assert writes_into(t.definition) == "clicks"
    assert writes_into("CREATE CONTINUOUS TRANSFORM public.slow AS SELECT url FROM clicks") is None


def test_insert_into_stream_leaves_out_pipelinedbs_arrival_timestamp_the_insert_fills():
    arrivals = "CREATE STREAM arrivals (x int, arrival_timestamp timestamptz DEFAULT now()) WITH (topic = 'a')"
    scope = Scope({**SCOPE.streams, "arrivals": parse(arrivals, NO_SCOPE)}, frozenset())
    t = parse_transform(
        "CREATE VIEW t WITH (action = transform, outputfunc = insert_into_stream('arrivals')) AS"
        " SELECT ms % 4 AS x FROM clicks",
        scope,
    )
    assert t.into == ("arrivals", ("x",))


def test_a_transform_reads_another_transforms_output_but_not_a_views_changes():
    clean = StreamDef("public.clean", "view:public.clean", (Column("url", "text"),), None, "", feed_of="public.clean")
    per_url = StreamDef(
        "public.per_url", "view:public.per_url", (Column("url", "text"),), ("url",), "", feed_of="public.per_url"
    )
    scope = Scope(SCOPE.streams, frozenset(), views={"public.clean": clean, "public.per_url": per_url})
    for source in ("output_of('clean')", "public.clean"):
        t = parse_transform(f"CREATE CONTINUOUS TRANSFORM t2 AS SELECT upper(url) AS u FROM {source}", scope)
        assert t.stream == "public.clean"
    with pytest.raises(DefinitionError, match="retract rows as well as add them"):
        parse_transform("CREATE CONTINUOUS TRANSFORM t3 AS SELECT url FROM public.per_url", scope)
