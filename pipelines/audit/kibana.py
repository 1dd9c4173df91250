"""`python -m pipelines.audit.kibana import|check`: the audit log's Kibana objects, from es/kibana/*.ndjson.

`es/kibana/audit.ndjson` is in Kibana's export format (one saved object a line): the data view `audit-*`,
a saved search, visualizations and a dashboard, each with a fixed id and its links to the others in
`references`. `import` posts the file to `/api/saved_objects/_import?overwrite=true`, so importing it again
replaces the same objects instead of adding copies. Kibana answers only after it has migrated its own
index at start, so `import` first waits for `/api/status` (with back-off, at most `--wait-s`).

`check` validates the file without Kibana: every line a saved object, every reference resolving to an
object of the file with the right type, and every reference named in the attributes (a saved search's
`indexRefName`, a dashboard panel's `panelRefName`) present in `references`. `import` runs it first.
Credentials are Elasticsearch's (`ES_USERNAME`, `ES_PASSWORD` or `$SECRETS_DIR/elastic_password`).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from pipelines.audit.elastic import ES_DIR
from pipelines.errors import StreamviewsError
from pipelines.logs import configure_logging, get_logger
from pipelines.settings import ElasticsearchSettings, KibanaSettings

log = get_logger("kibana")

OBJECTS_FILE = ES_DIR / "kibana" / "audit.ndjson"
# Seconds between /api/status probes: doubling from the first to the last.
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 15.0


class KibanaError(StreamviewsError):
    """Kibana could not be reached, or refused the saved objects."""


def read_objects(path: Path) -> list[dict[str, Any]]:
    """The saved objects of an export file, one JSON object a line.

    Blank lines and the summary line Kibana appends to its own exports (`{"exportedCount": ...}`) are
    skipped, so a file re-exported from Kibana's UI can replace this one as it is.
    """
    objects = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            document = json.loads(line)
        except ValueError as e:
            raise KibanaError(f"{path.name}:{number}: not JSON: {e}") from e
        if isinstance(document, dict) and "exportedCount" in document:
            continue
        if not isinstance(document, dict) or not {"type", "id", "attributes"} <= document.keys():
            raise KibanaError(f"{path.name}:{number}: a saved object needs type, id and attributes")
        objects.append(document)
    return objects


def referenced_names(saved: dict[str, Any]) -> set[str]:
    """Reference names an object's attributes use, each of which must be in its `references`.

    A search source names its data view by `indexRefName`; a dashboard panel by `panelRefName`, stored
    in `references` prefixed with the panel's index (`1:panel_1`), as Kibana 8 exports them.
    """
    attributes = saved["attributes"]
    names = set()
    source = attributes.get("kibanaSavedObjectMeta", {}).get("searchSourceJSON")
    if source:
        ref = json.loads(source).get("indexRefName")
        if ref:
            names.add(ref)
    if attributes.get("savedSearchRefName"):
        names.add(attributes["savedSearchRefName"])
    for panel in json.loads(attributes.get("panelsJSON", "[]")):
        if "panelRefName" in panel:
            names.add(f"{panel['panelIndex']}:{panel['panelRefName']}")
    return names


def problems(objects: list[dict[str, Any]]) -> list[str]:
    """Why Kibana would refuse the objects or import them broken; empty when they are consistent."""
    found = []
    keys = [(saved["type"], saved["id"]) for saved in objects]
    found += [f"{kind} {key} appears more than once" for kind, key in sorted(set(keys)) if keys.count((kind, key)) > 1]
    for saved in objects:
        where = f"{saved['type']} {saved['id']}"
        references = saved.get("references", [])
        if not all(isinstance(ref, dict) and {"name", "type", "id"} <= ref.keys() for ref in references):
            found.append(f"{where}: every reference needs a name, type and id")
            continue
        for ref in references:
            if (ref["type"], ref["id"]) not in keys:
                found.append(f"{where}: reference {ref['name']} points at {ref['type']} {ref['id']}, not in the file")
        try:
            used = referenced_names(saved)
        except (ValueError, KeyError, AttributeError) as e:
            found.append(f"{where}: unreadable attributes: {e!r}")
            continue
        named = {ref["name"] for ref in references}
        found += [f"{where}: uses reference {name}, missing from references" for name in sorted(used - named)]
        found += [f"{where}: reference {name} is not used by its attributes" for name in sorted(named - used)]
    return found


def check(path: Path) -> list[dict[str, Any]]:
    """The objects of `path`, or KibanaError listing every problem."""
    objects = read_objects(path)
    found = problems(objects)
    if found:
        raise KibanaError(f"{path.name}: " + "; ".join(found))
    return objects


def wait_until_ready(
    http: httpx.Client,
    wait_s: float,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> float:
    """Poll `/api/status` until Kibana answers 200; returns the seconds waited.

    Connection refused and 503 (Kibana starting or migrating) are retried with doubling pauses until
    `wait_s` has passed; 401 is not, since waiting does not fix credentials.
    """
    started = clock()
    pause, last = FIRST_BACKOFF_S, "no answer yet"
    while True:
        try:
            response = http.get("/api/status")
            if response.status_code == 200:
                return clock() - started
            if response.status_code == 401:
                raise KibanaError("Kibana refused the Elasticsearch credentials (401)")
            last = f"status {response.status_code}"
        except httpx.TransportError as e:
            last = f"{type(e).__name__}: {e}"
        left = wait_s - (clock() - started)
        if left <= 0:
            raise KibanaError(f"Kibana not ready after {wait_s:.0f}s ({last})")
        log.info("waiting for kibana", answer=last, retry_in_s=round(min(pause, left), 1))
        sleep(min(pause, left))
        pause = min(pause * 2, MAX_BACKOFF_S)


def _describe(error: dict[str, Any]) -> str:
    saved = f"{error.get('type')} {error.get('id')}"
    title = error.get("meta", {}).get("title") or error.get("title")
    reason = error.get("error", {})
    if reason.get("type") == "missing_references":
        missing = ", ".join(f"{ref['type']} {ref['id']}" for ref in reason.get("references", []))
        detail = f"missing references: {missing}"
    else:
        detail = reason.get("message") or reason.get("type") or json.dumps(reason)
    return f"{saved}{f' ({title})' if title else ''}: {detail}"


def import_objects(http: httpx.Client, path: Path) -> int:
    """POST the export file to the import API, overwriting objects with the same ids; returns how many."""
    files = {"file": (path.name, path.read_bytes(), "application/ndjson")}
    response = http.post("/api/saved_objects/_import", params={"overwrite": "true"}, files=files)
    if response.status_code != 200:
        raise KibanaError(f"import of {path.name}: Kibana answered {response.status_code}: {response.text[:2000]}")
    try:
        result = response.json()
    except ValueError as e:
        raise KibanaError(f"import of {path.name}: Kibana's answer is not JSON: {response.text[:2000]}") from e
    if not result.get("success"):
        errors = [_describe(error) for error in result.get("errors", [])] or [json.dumps(result)[:2000]]
        raise KibanaError(f"import of {path.name} failed: " + "; ".join(errors))
    return int(result.get("successCount", 0))


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.audit.kibana", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("import", "wait for Kibana, then import the objects"), ("check", "validate only")):
        command = commands.add_parser(name, help=help_text)
        command.add_argument("--file", type=Path, default=OBJECTS_FILE, help=f"default {OBJECTS_FILE}")
        if name == "import":
            command.add_argument("--wait-s", type=float, default=300.0, help="longest wait for Kibana (300)")
    args = parser.parse_args(argv)
    configure_logging()
    try:
        objects = check(args.file)
        if args.command == "check":
            print(f"{args.file}: {len(objects)} saved objects, references consistent")
            return 0
        kibana, elasticsearch = KibanaSettings(), ElasticsearchSettings()
        log.info("starting", kibana=kibana.url, file=str(args.file), objects=len(objects))
        headers = {"kbn-xsrf": "true"}
        with httpx.Client(base_url=kibana.url, auth=elasticsearch.basic_auth(), headers=headers, timeout=60) as http:
            waited = wait_until_ready(http, args.wait_s)
            log.info("kibana ready", url=kibana.url, waited_s=round(waited, 1))
            count = import_objects(http, args.file)
        log.info("saved objects imported", file=str(args.file), count=count)
    except (KibanaError, OSError, httpx.HTTPError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
