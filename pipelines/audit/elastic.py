"""Elasticsearch clients, the audit indices' names and the index templates: the one place for each.

Audit documents live in one index per day, `<prefix>-YYYY.MM.DD` (prefix `AUDIT_INDEX_PREFIX`, `audit` by
default), so retention drops whole indices instead of deleting documents, and every such index matches the
`audit-*` template in `es/templates/audit.json`. The puller, retention and search build names with
`index_name` and read them back with `index_day`, never by hand.

`python -m pipelines.audit.elastic templates` PUTs every `es/templates/*.json` as a composable index template
named after the file (`audit.json` -> `_index_template/audit`); PUT replaces, so running it twice changes
nothing. A template applies to indices created after it, which is why it must be in place before the puller
writes its first document.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

from elasticsearch import ApiError, Elasticsearch, TransportError

from pipelines.errors import StreamviewsError
from pipelines.logs import configure_logging, get_logger
from pipelines.settings import ElasticsearchSettings

log = get_logger("elastic")

ES_DIR = Path(os.environ.get("ES_DIR", Path(__file__).resolve().parents[2] / "es"))

_DAY = re.compile(r"\d{4}\.\d{2}\.\d{2}")


class ElasticError(StreamviewsError):
    """Elasticsearch refused a template, or could not be reached."""


def client(settings: ElasticsearchSettings, **kw: Any) -> Elasticsearch:
    """A client for `settings`' endpoint and credentials; `kw` (e.g. `request_timeout=`) wins over defaults."""
    options: dict[str, Any] = {"basic_auth": settings.basic_auth(), "request_timeout": 30}
    options.update(kw)
    return Elasticsearch(settings.url, **options)


def index_name(prefix: str, day: datetime.date) -> str:
    """The index holding one day's audit documents: `index_name("audit", date(2026, 11, 22))` -> `audit-2026.11.22`."""
    return f"{prefix}-{day:%Y.%m.%d}"


def index_day(name: str, prefix: str) -> datetime.date | None:
    """The day of an index named by `index_name(prefix, day)`; None for any other name.

    `audit-t1-2026.11.22` is not a day of prefix `audit`: its suffix is not a date, so one prefix never
    claims (nor, in retention, deletes) another prefix's indices.
    """
    suffix = name.removeprefix(f"{prefix}-")
    if suffix == name or not _DAY.fullmatch(suffix):
        return None
    try:
        return datetime.datetime.strptime(suffix, "%Y.%m.%d").date()
    except ValueError:
        return None


def apply_index_templates(es: Elasticsearch, folder: Path = ES_DIR / "templates") -> list[str]:
    """PUT every `*.json` in `folder` as the composable template named by its file stem; returns the names."""
    names = []
    for path in sorted(folder.glob("*.json")):
        try:
            body = json.loads(path.read_text())
        except ValueError as e:
            raise ElasticError(f"{path.name}: not JSON: {e}") from e
        try:
            es.indices.put_index_template(name=path.stem, body=body)
        except ApiError as e:
            raise ElasticError(f"{path.name}: Elasticsearch refused the template: {e}") from e
        log.info(
            "index template applied",
            template=path.stem,
            patterns=body.get("index_patterns"),
            version=body.get("_meta", {}).get("version"),
        )
        names.append(path.stem)
    return names


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.audit.elastic", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("templates", help="create or update every index template in es/templates/")
    parser.parse_args(argv)
    configure_logging()
    settings = ElasticsearchSettings()
    log.info("starting", **settings.describe())
    try:
        with client(settings) as es:
            apply_index_templates(es)
    except (ElasticError, TransportError) as e:
        print(f"error: {settings.url}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
