"""`python -m pipelines.cv`: define, list and drop streams and continuous views.

    python -m pipelines.cv define "CREATE CONTINUOUS VIEW social.x AS SELECT ... GROUP BY ..."
    python -m pipelines.cv define --file my_views.sql
    python -m pipelines.cv list
    python -m pipelines.cv drop-view social.x

Connects as the owner role (PGUSER defaults to sv_owner here), since definitions create tables.
"""

import argparse
import sys
from pathlib import Path

import psycopg

from pipelines.cv import catalog
from pipelines.cv.definitions import DefinitionError
from pipelines.logs import configure_logging
from pipelines.settings import ROLE_OWNER, PostgresSettings


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.cv", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    define = commands.add_parser("define", help="create streams or views from statements")
    define.add_argument("statement", nargs="?", help="one CREATE STREAM / CREATE CONTINUOUS VIEW statement")
    define.add_argument("--file", type=Path, help="a file of statements")
    commands.add_parser("list", help="streams and views with their definitions")
    drop = commands.add_parser("drop-view", help="drop a continuous view and its table")
    drop.add_argument("name", help="schema.name")
    drop_stream = commands.add_parser("drop-stream", help="drop a stream without views, and its state")
    drop_stream.add_argument("name")
    args = parser.parse_args(argv)

    configure_logging()
    settings = PostgresSettings()
    user = settings.user if "PGUSER" in __import__("os").environ else ROLE_OWNER
    try:
        with psycopg.connect(settings.conninfo(user=user), autocommit=True) as conn:
            if args.command == "define":
                if bool(args.statement) == bool(args.file):
                    parser.error("give a statement or --file, not both")
                text = args.file.read_text() if args.file else args.statement
                for outcome in catalog.define_file(conn, text):
                    print(outcome)
            elif args.command == "list":
                for kind, name, definition in conn.execute(
                    "SELECT 'stream', name, definition FROM cv.streams"
                    " UNION ALL SELECT 'view', name, definition FROM cv.views ORDER BY 1, 2"
                ):
                    print(f"-- {kind} {name}\n{definition};\n")
            elif args.command == "drop-view":
                print(catalog.drop_view(conn, args.name))
            else:
                print(catalog.drop_stream(conn, args.name))
    except DefinitionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
