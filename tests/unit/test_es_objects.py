"""The audit index template and the Kibana saved objects, read as files: the promises they make.

Elasticsearch checks the template for real in tests/integration/test_search.py; Kibana is not available
here, so its objects are checked for the structure Kibana 8's import relies on.
"""

from __future__ import annotations

import datetime
import fnmatch
import json
from typing import Any

import pytest

from pipelines.audit import kibana
from pipelines.audit.elastic import ES_DIR, index_name
from pipelines.settings import AuditSettings

TEMPLATE = json.loads((ES_DIR / "templates" / "audit.json").read_text())
MAPPINGS = TEMPLATE["template"]["mappings"]
PROPERTIES = MAPPINGS["properties"]
OBJECTS = kibana.read_objects(kibana.OBJECTS_FILE)


def objects_of(kind: str) -> list[dict[str, Any]]:
    return [saved for saved in OBJECTS if saved["type"] == kind]


def vis_state(saved: dict[str, Any]) -> dict[str, Any]:
    return json.loads(saved["attributes"]["visState"])


def search_source(saved: dict[str, Any]) -> dict[str, Any]:
    return json.loads(saved["attributes"]["kibanaSavedObjectMeta"]["searchSourceJSON"])


def field_types(mapping: dict[str, Any]) -> list[str]:
    """Every `type` in a mapping, multi-fields and dynamic templates included."""
    found = [mapping["type"]] if isinstance(mapping.get("type"), str) else []
    for value in mapping.values():
        if isinstance(value, dict):
            found += field_types(value)
        elif isinstance(value, list):
            found += [kind for item in value if isinstance(item, dict) for kind in field_types(item)]
    return found


# ---- the index template -----------------------------------------------------------------------


@pytest.mark.parametrize("prefix", [AuditSettings().index_prefix, "audit-t1a2b3", "audit-eu_west"])
def test_the_template_applies_to_the_daily_index_of_any_audit_prefix(prefix):
    name = index_name(prefix, datetime.date(2026, 11, 22))

    assert [pattern for pattern in TEMPLATE["index_patterns"] if fnmatch.fnmatch(name, pattern)] == ["audit-*"]


def test_audit_indices_fit_a_single_node_and_are_searchable_within_a_second():
    index = TEMPLATE["template"]["settings"]["index"]

    assert (index["number_of_shards"], index["number_of_replicas"], index["refresh_interval"]) == (1, 0, "1s")


def test_an_event_with_many_odd_extra_fields_is_never_rejected():
    total_fields = TEMPLATE["template"]["settings"]["index"]["mapping"]["total_fields"]

    assert total_fields["limit"] >= 1000
    assert total_fields["ignore_dynamic_beyond_limit"] is True, "fields past the limit are ignored, not fatal"
    assert MAPPINGS["date_detection"] is False, "a date-looking extra would make the next non-date one fail"
    assert MAPPINGS.get("numeric_detection", False) is False


def test_the_contract_fields_have_their_types():
    assert PROPERTIES["ts"]["type"] == "date"
    assert PROPERTIES["uid"]["type"] == "long"
    assert {PROPERTIES[name]["type"] for name in ("pg_table", "pg_ctid", "index_error")} == {"keyword"}


def test_content_is_full_text_with_the_standard_analyzer_and_a_short_keyword():
    content = PROPERTIES["content"]

    assert (content["type"], content["analyzer"]) == ("text", "standard")
    assert content["fields"]["keyword"] == {"type": "keyword", "ignore_above": 256}


def test_any_other_string_is_a_keyword_with_a_text_subfield():
    (rule,) = [next(iter(template.values())) for template in MAPPINGS["dynamic_templates"]]

    assert rule["match_mapping_type"] == "string"
    assert rule["mapping"]["type"] == "keyword"
    assert rule["mapping"]["ignore_above"] == 1024, "extras are up to 1024 characters"
    assert rule["mapping"]["fields"]["text"]["type"] == "text"


def test_no_field_is_mapped_as_ip_since_an_extra_named_ip_may_hold_anything():
    assert "ip" not in field_types(MAPPINGS)


def test_the_template_says_which_version_it_is():
    assert isinstance(TEMPLATE["_meta"]["version"], int)


# ---- the Kibana saved objects -----------------------------------------------------------------


def test_every_line_of_the_export_is_a_saved_object():
    lines = [line for line in kibana.OBJECTS_FILE.read_text().splitlines() if line.strip()]

    assert len(OBJECTS) == len(lines)
    assert {saved["type"] for saved in OBJECTS} == {"index-pattern", "search", "visualization", "dashboard"}


def test_every_reference_resolves_to_an_object_of_the_file_with_its_type():
    assert kibana.problems(OBJECTS) == []


def test_the_data_view_is_audit_star_with_ts_as_its_time_field():
    (data_view,) = objects_of("index-pattern")

    assert data_view["attributes"]["title"] == "audit-*"
    assert data_view["attributes"]["timeFieldName"] == "ts"


def test_the_saved_search_lists_the_events_newest_first_from_the_data_view():
    (saved_search,) = objects_of("search")
    (data_view,) = objects_of("index-pattern")
    source = search_source(saved_search)

    assert saved_search["attributes"]["columns"][:1] == ["uid"]
    assert {"content", "pg_table", "pg_ctid"} <= set(saved_search["attributes"]["columns"])
    assert saved_search["attributes"]["sort"] == [["ts", "desc"]]
    assert {"name": source["indexRefName"], "type": "index-pattern", "id": data_view["id"]} in saved_search[
        "references"
    ]


def test_a_visualization_counts_events_over_time_split_by_action():
    def over_time_by_action(state: dict[str, Any]) -> bool:
        buckets = {(agg["schema"], agg["type"], agg["params"].get("field")) for agg in state["aggs"]}
        return {("segment", "date_histogram", "ts"), ("group", "terms", "action")} <= buckets

    assert [saved["id"] for saved in objects_of("visualization") if over_time_by_action(vis_state(saved))]


def test_a_visualization_ranks_the_users_with_the_most_events():
    def top_users(state: dict[str, Any]) -> bool:
        return any(agg["type"] == "terms" and agg["params"]["field"] == "uid" for agg in state["aggs"])

    assert [saved["id"] for saved in objects_of("visualization") if top_users(vis_state(saved))]


def test_visualizations_aggregate_only_fields_the_template_maps():
    for saved in objects_of("visualization"):
        fields = {agg["params"]["field"] for agg in vis_state(saved)["aggs"] if "field" in agg["params"]}

        assert fields <= PROPERTIES.keys(), f"{saved['id']}: {sorted(fields - PROPERTIES.keys())} not in the template"


def test_the_dashboard_shows_the_visualizations_and_the_saved_search():
    (dashboard,) = objects_of("dashboard")
    panels = json.loads(dashboard["attributes"]["panelsJSON"])
    by_name = {ref["name"]: ref for ref in dashboard["references"]}

    assert {f"{panel['panelIndex']}:{panel['panelRefName']}" for panel in panels} == set(by_name)
    for panel in panels:
        assert by_name[f"{panel['panelIndex']}:{panel['panelRefName']}"]["type"] == panel["type"]
    shown = {(ref["type"], ref["id"]) for ref in dashboard["references"]}
    assert shown == {(saved["type"], saved["id"]) for saved in objects_of("visualization") + objects_of("search")}


# ---- the checks themselves --------------------------------------------------------------------


def test_a_reference_to_an_object_missing_from_the_file_is_a_problem():
    search = {**objects_of("search")[0], "references": [{**objects_of("search")[0]["references"][0], "id": "gone"}]}

    assert kibana.problems([*objects_of("index-pattern"), search]) == [
        "search streamviews-audit-events: reference kibanaSavedObjectMeta.searchSourceJSON.index"
        " points at index-pattern gone, not in the file"
    ]


def test_a_panel_without_its_reference_is_a_problem():
    (dashboard,) = objects_of("dashboard")
    truncated = {**dashboard, "references": dashboard["references"][1:]}

    (problem,) = kibana.problems([saved for saved in OBJECTS if saved["type"] != "dashboard"] + [truncated])

    missing = dashboard["references"][0]["name"]
    assert problem == f"dashboard streamviews-audit: uses reference {missing}, missing from references"


def test_a_line_that_is_not_a_saved_object_is_refused(tmp_path):
    path = tmp_path / "broken.ndjson"
    path.write_text('{"type": "search", "id": "x", "attributes": {}}\n{"id": "y"}\n')

    with pytest.raises(kibana.KibanaError, match=r"broken.ndjson:2: a saved object needs type, id and attributes"):
        kibana.read_objects(path)


def test_the_summary_line_of_a_kibana_export_is_skipped(tmp_path):
    path = tmp_path / "export.ndjson"
    path.write_text(kibana.OBJECTS_FILE.read_text() + '{"excludedObjects":[],"exportedCount":5}\n')

    assert kibana.read_objects(path) == OBJECTS
