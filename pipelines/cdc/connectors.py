"""`python -m pipelines.cdc.connectors apply|status|delete`: the Kafka Connect connectors in connectors/.

Each `connectors/<name>.json` holds `{"name": ..., "config": {...}}`. `apply` renders the
environment's values into it (`@{PGHOST}`, `@{PGPORT}`, `@{APP_DATABASE}`, `@{SECRETS_DIR}`) and PUTs
it to `/connectors/<name>/config`, which creates or updates: running it twice changes nothing.
Passwords are never in the files: they reference the worker's config providers,
e.g. `${dir:@{SECRETS_DIR}:pg_cdc_password}`.

`status` shows connector and task states, and the replication slot's lag: a connector retrying a
lost database still reports RUNNING, but its slot stops confirming WAL.
"""

from __future__ import annotations

import argparse
import json
import os
import string
import sys
from pathlib import Path

import httpx
import psycopg

from pipelines.errors import StreamviewsError
from pipelines.logs import configure_logging, get_logger
from pipelines.settings import ROLE_CDC, ConnectSettings, PostgresSettings

log = get_logger("connectors")

CONNECTORS_DIR = Path(os.environ.get("CONNECTORS_DIR", Path(__file__).resolve().parents[2] / "connectors"))


class ConnectorError(StreamviewsError):
    """A connector could not be applied or read."""


class _Template(string.Template):
    delimiter = "@"


def load(path: Path, postgres: PostgresSettings, connect: ConnectSettings | None = None) -> tuple[str, dict[str, str]]:
    """A connector file with this environment's values filled in: (name, config).

    `@{SECRETS_DIR}` is the folder the worker's config providers read (CONNECT_PROVIDERS_DIR, else
    SECRETS_DIR, else /run/secrets).
    """
    secrets = (connect.providers_dir if connect else None) or postgres.secrets_dir or "/run/secrets"
    values = {
        "PGHOST": postgres.host,
        "PGPORT": str(postgres.port),
        "PGDATABASE": postgres.database,
        "APP_DATABASE": postgres.app_database,
        "SECRETS_DIR": str(secrets),
    }
    try:
        document = json.loads(_Template(path.read_text()).substitute(values))
    except (KeyError, ValueError) as e:
        raise ConnectorError(f"{path.name}: {e}") from e
    return document["name"], document["config"]


def slot_names(folder: Path = CONNECTORS_DIR) -> list[tuple[str, str]]:
    """(slot, publication) of every connector file naming a slot; no environment needed."""
    slots = []
    for path in sorted(folder.glob("*.json")):
        config = json.loads(path.read_text())["config"]
        if "slot.name" in config:
            slots.append((config["slot.name"], config.get("publication.name", "dbz_publication")))
    return slots


def apply(connect: ConnectSettings, postgres: PostgresSettings, folder: Path = CONNECTORS_DIR) -> list[str]:
    """PUT every connector's config (create or update); returns their names."""
    names = []
    for path in sorted(folder.glob("*.json")):
        name, config = load(path, postgres, connect)
        response = httpx.put(
            f"{connect.url}/connectors/{name}/config", json=config, auth=connect.basic_auth(), timeout=60
        )
        if response.status_code not in (200, 201):
            raise ConnectorError(f"{name}: Connect answered {response.status_code}: {response.text[:2000]}")
        # A task that failed (e.g. its database was down for long) stays FAILED until restarted; an
        # unchanged config does not restart it, so `apply` (and `make up`) heals it explicitly.
        restart = httpx.post(
            f"{connect.url}/connectors/{name}/restart",
            params={"includeTasks": "true", "onlyFailed": "true"},
            auth=connect.basic_auth(),
            timeout=60,
        )
        if restart.status_code not in (202, 204, 404, 409):
            raise ConnectorError(f"{name}: restarting failed tasks: Connect answered {restart.status_code}")
        log.info("connector applied", connector=name, created=response.status_code == 201)
        names.append(name)
    return names


def state(connect: ConnectSettings, name: str) -> tuple[str, list[str]]:
    """(connector state, task states) as Connect reports them; ("MISSING", []) when not registered."""
    response = httpx.get(f"{connect.url}/connectors/{name}/status", auth=connect.basic_auth(), timeout=30)
    if response.status_code == 404:
        return "MISSING", []
    response.raise_for_status()
    status = response.json()
    return status["connector"]["state"], [task["state"] for task in status.get("tasks", [])]


def slot_lag(postgres: PostgresSettings, slot: str) -> tuple[bool, int] | None:
    """(active, bytes of WAL not yet confirmed) of a replication slot; None if it does not exist."""
    # The CDC role may connect to the captured tables' database only; slots are listed cluster-wide.
    with psycopg.connect(postgres.conninfo(user=ROLE_CDC, dbname=postgres.app_database), autocommit=True) as conn:
        return conn.execute(
            "SELECT active, pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)::bigint"
            " FROM pg_replication_slots WHERE slot_name = %s",
            (slot,),
        ).fetchone()


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.cdc.connectors", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("apply", help="create or update every connector in connectors/")
    commands.add_parser("status", help="connector and task states, replication slot lag")
    delete = commands.add_parser("delete", help="remove a connector (its replication slot stays)")
    delete.add_argument("name")
    args = parser.parse_args(argv)
    configure_logging()
    connect, postgres = ConnectSettings(), PostgresSettings()
    try:
        if args.command == "apply":
            apply(connect, postgres)
        elif args.command == "status":
            for path in sorted(CONNECTORS_DIR.glob("*.json")):
                name, config = load(path, postgres)
                connector, tasks = state(connect, name)
                lag = slot_lag(postgres, config.get("slot.name", "")) if "slot.name" in config else None
                slot = (
                    "no slot" if lag is None else f"slot {'active' if lag[0] else 'INACTIVE'}, {lag[1]:,} bytes behind"
                )
                print(f"{name}: connector {connector}, tasks {', '.join(tasks) or '-'}; {slot}")
        else:
            httpx.delete(
                f"{connect.url}/connectors/{args.name}", auth=connect.basic_auth(), timeout=30
            ).raise_for_status()
            print(f"{args.name} deleted; drop its slot with pg_drop_replication_slot() if it is gone for good")
    except (ConnectorError, httpx.HTTPError, psycopg.Error) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
