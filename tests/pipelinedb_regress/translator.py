r"""PipelineDB 1.0 regression cases read into steps this project can run.

A case is PipelineDB's own `expected/<name>.out`: psql's echo of each statement followed by what it
printed (a table of rows, an ERROR, a NOTICE). `read_case` splits it into statements with their
expected output; `translate` turns each into a step against this project's SQL:

- `CREATE FOREIGN TABLE s (...) SERVER pipelinedb` -> `CREATE STREAM` of a stream named for this run,
  on a topic of its own, consumed by the run's own runner group;
- `CREATE VIEW v [WITH (...)] AS SELECT ... FROM <stream>` -> `CREATE CONTINUOUS VIEW <schema>.v`
  (`action = transform` is passed as written: the catalog reads PipelineDB's spelling);
- `INSERT INTO <stream>` / `SELECT ...` / other PostgreSQL statements run as written, names rewritten;
- what has no meaning here (PipelineDB's internals: matrels, its settings and catalog, psql's `\\d`)
  is a step `unsupported` with the reason.

Pure: no database. The runner (tests.pipelinedb_regress.runner) executes the steps.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pglast
from pglast import ast
from pglast.parser import scan

CASES = Path(__file__).parent / "cases"

_TABLE_SEPARATOR = re.compile(r"^-+(\+-+)*$")
_ROW_COUNT = re.compile(r"^\((\d+) rows?\)$")
_MESSAGE = re.compile(r"^(ERROR|NOTICE|WARNING|DETAIL|HINT|CONTEXT|INFO|LINE \d+|QUERY|STATEMENT):")
# Lines that continue a message psql printed (DETAIL of a DROP ... CASCADE lists one object per line).
_CONTINUED = re.compile(r"^drop cascades to |^(view|foreign table|table|function|type) \S+ depends on ")
_SKIPPED_TOKENS = frozenset({"SQL_COMMENT", "C_COMMENT"})

# What has no meaning on this system, by the words that show it, with the reason the table gives.
INTERNALS: list[tuple[re.Pattern[str], str]] = [
    (
        re.compile(r"\boutputfunc\s*=\s*(?!(pipelinedb\s*\.\s*)?insert_into_stream\b)", re.I),
        "a transform's outputfunc that is a trigger function (run per row in PipelineDB's worker): here "
        "insert_into_stream, a view over the transform's output or a sink does its work",
    ),
    (re.compile(r"_mrel\b|_seq\b|_osrel\b|\bmatrel\b", re.I), "reads a view's matrel (PipelineDB's storage internals)"),
    (
        re.compile(r"\bpipelinedb\.(?!activate|deactivate|truncate_continuous_view|insert_into_stream)\w+", re.I),
        "PipelineDB's own catalog or settings (pipelinedb.*)",
    ),
    (
        re.compile(
            r"\bpg_class\b|\bpg_attribute\b|\bpg_index\b|\bpg_depend\b|\bpg_proc\b|\bpg_type\b|::regclass\b", re.I
        ),
        "PostgreSQL 11 catalog internals of PipelineDB's objects",
    ),
    (
        re.compile(r"\b(combiner|worker|queue)_\w+\b|\bcontinuous_(queries|query)_\w+", re.I),
        "combiner/worker settings of PipelineDB's processes",
    ),
    (re.compile(r"^\s*(ANALYZE|VACUUM|CLUSTER|REINDEX)\b", re.I), "storage maintenance of PipelineDB's matrels"),
    (re.compile(r"\bEXPLAIN\b", re.I), "PipelineDB's plans (EXPLAIN output)"),
    (re.compile(r"^\s*\\", re.I), "a psql meta-command"),
    (
        re.compile(r"^\s*(SET|RESET)\s+search_path\b", re.I),
        "the case's search_path: the harness keeps its own (the case's schema, then public and streams)",
    ),
    (
        re.compile(r"\b(CREATE|DROP|ALTER)\s+(CONSTRAINT\s+)?TRIGGER\b", re.I),
        "triggers on matrels (PipelineDB internals)",
    ),
    (re.compile(r"\bpg_get_viewdef\b|\bpipeline_get_\w+", re.I), "PipelineDB's stored definitions"),
]


@dataclass(frozen=True)
class Expected:
    """What PipelineDB printed for a statement: rows of a table (as psql's text), or an error."""

    columns: list[str] | None = None
    rows: list[tuple[str | None, ...]] | None = None
    error: str | None = None


@dataclass(frozen=True)
class Statement:
    """One statement of a case, as written, with its expected output."""

    text: str
    expected: Expected = field(default_factory=Expected)


@dataclass(frozen=True)
class Step:
    """What the runner does for one statement.

    kind: `stream` (catalog define), `view` (catalog define), `drop_stream`, `drop_view` (catalog
    drop), `rename_view` (ALTER VIEW ... RENAME TO / SET SCHEMA of a continuous view: catalog drop,
    then define under `sql`, the new name), `drop_schema` (DROP SCHEMA ... CASCADE: the continuous
    views and transforms in schema `name` dropped by the catalog first, then `sql`), `sql` (runs as
    written; compared when it prints rows or an error), or `unsupported`.
    """

    kind: str
    statement: Statement
    sql: str = ""
    name: str = ""
    reason: str = ""
    source: str = ""  # the name the case gave what the step creates


def significant(text: str) -> list:
    """The scanner's tokens of `text` without comments; [] when it does not scan (an open string)."""
    try:
        return [t for t in scan(text) if t.name not in _SKIPPED_TOKENS]
    except Exception:
        return []


def _complete(text: str) -> bool:
    tokens = significant(text)
    return bool(tokens) and tokens[-1].name == "ASCII_59"


def read_case(text: str) -> list[Statement]:
    """The statements of a psql echo (`.out` file), each with the table or error printed after it."""
    lines = text.splitlines()
    statements: list[Statement] = []
    pending: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if not pending and line.lstrip().startswith("\\"):  # a meta-command: one line, maybe a table after
            i, expected = _output(lines, _described(lines, i + 1))
            statements.append(Statement(line.strip(), expected))
            continue
        pending.append(line)
        i += 1
        joined = "\n".join(pending)
        if _complete(joined):
            i, expected = _output(lines, i)
            statements.append(Statement(joined.strip(), expected))
            pending = []
    return statements


def _described(lines: list[str], i: int) -> int:
    r"""Past what `\d` printed from line i (a title over a table, then indexes, options: up to a blank line).

    Its title line is not a table's header, so without this its lines were read as the next
    statement's first lines, and that statement (an INSERT, a CREATE VIEW) silently never ran.
    """
    if i + 2 < len(lines) and lines[i].strip() and _is_table(lines, i + 1):
        while i < len(lines) and lines[i].strip():
            i += 1
        i += 1  # the blank line that ends it
    return i


def _output(lines: list[str], i: int) -> tuple[int, Expected]:
    """Read what psql printed from line i: a table, then messages; where the next statement starts."""
    columns = rows = None
    error = None
    if _is_table(lines, i):
        columns = [c.strip() for c in lines[i].split("|")]
        rows = []
        i += 2
        while i < len(lines) and not _ROW_COUNT.match(lines[i].strip()):
            rows.append(_cells(lines[i], len(columns)))
            i += 1
        i += 1  # "(n rows)"
        if i < len(lines) and not lines[i].strip():
            i += 1
    while i < len(lines) and (
        _MESSAGE.match(lines[i])
        or _CONTINUED.match(lines[i])
        or (error and lines[i].startswith(" ") and "^" in lines[i])
    ):
        if lines[i].startswith("ERROR:") and error is None:
            error = lines[i][len("ERROR:") :].strip()
        i += 1
    return i, Expected(columns, rows, error)


def _is_table(lines: list[str], i: int) -> bool:
    """Psql's table starts at line i: a header, then a separator of its width (a comment of dashes is not one)."""
    if i + 1 >= len(lines) or not lines[i].strip() or lines[i].lstrip().startswith("--") or _MESSAGE.match(lines[i]):
        return False
    header, separator = lines[i].rstrip(), lines[i + 1]
    if not _TABLE_SEPARATOR.match(separator) or len(separator) < len(header):
        return False
    return [k for k, c in enumerate(header) if c == "|"] == [k for k, c in enumerate(separator) if c == "+"]


def _cells(line: str, width: int) -> tuple[str | None, ...]:
    """One row of psql's aligned table: cells trimmed; an empty cell is NULL or the empty string."""
    cells = [c.strip() for c in line.split(" | ")] if width > 1 else [line.strip()]
    if len(cells) != width:  # a '|' inside a value: split by the header's widths instead
        cells = [c.strip() for c in line.split("|")][:width]
    return tuple(c if c != "" else None for c in cells)


# --- translation -------------------------------------------------------------------------------

_FOREIGN_TABLE = re.compile(
    r"^\s*CREATE\s+FOREIGN\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?((?:\w+\.)?\w+)\s*\((.*)\)\s*SERVER\s+pipelinedb\s*(.*?)$",
    re.I | re.S,
)
_CREATE_VIEW = re.compile(
    r"^\s*CREATE\s+(OR\s+REPLACE\s+)?VIEW\s+(\w+|\"[^\"]+\")\s*(WITH\s*\(.*?\))?\s*AS\s+(.*?);?\s*$", re.I | re.S
)
_DROP = re.compile(r"^\s*DROP\s+(FOREIGN\s+TABLE|VIEW)\s+(IF\s+EXISTS\s+)?([\w\s,.]+?)(\s+CASCADE)?\s*$", re.I)
# PipelineDB renamed and moved a continuous view with ALTER VIEW, and dropped its views with their
# schema; here plain DDL may not (sql/guards.sql), so these go through the catalog.
_ALTER_VIEW = re.compile(r"^\s*ALTER\s+VIEW\s+(\w+)\s+(RENAME\s+TO|SET\s+SCHEMA)\s+(\w+)\s*$", re.I)
_DROP_SCHEMA = re.compile(r"^\s*DROP\s+SCHEMA\s+(?:IF\s+EXISTS\s+)?(\w+)\s+CASCADE\s*$", re.I)
_CREATE_TABLE = re.compile(r"^\s*CREATE\s+(?:TEMP\w*\s+|UNLOGGED\s+)?TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.I)
_CREATE_OTHER = re.compile(
    r"^\s*CREATE\s+(?:OR\s+REPLACE\s+)?(?:TYPE|FUNCTION|AGGREGATE|SEQUENCE|INDEX\s+\w+\s+ON)"
    r"\s+(\w+)",
    re.I,
)


@dataclass
class Names:
    """The run's renaming: PipelineDB's stream, view and table names to this run's."""

    schema: str
    suffix: str
    group: str
    streams: dict[str, str] = field(default_factory=dict)
    views: set[str] = field(default_factory=set)
    tables: set[str] = field(default_factory=set)
    schemas: set[str] = field(default_factory=set)  # schemas the case creates (or renames to): dropped after
    types: set[str] = field(default_factory=set)  # types the case creates: qualified in its streams' columns
    # Schemas the case sets its search_path to: what it creates unqualified is in the run's schema
    # (the harness keeps its own search_path), so `alias.t` of those is the run's `schema.t`.
    aliases: set[str] = field(default_factory=set)
    # Streams declared again after a DROP: each declaration has a topic of its own (`generation`).
    declared: dict[str, int] = field(default_factory=dict)

    def topic(self, stream: str, generation: int | None = None) -> str:
        """The topic of a declaration of `stream` (by default its last one).

        A stream PipelineDB dropped kept no events; a topic here keeps them, and a runner that had not
        yet read the new declaration would decode them, and the new ones, with the old columns.
        """
        generation = self.declared.get(stream, 0) if generation is None else generation
        again = f"-{generation}" if generation else ""
        return f"pdbregress-{self.suffix}-{stream.replace('.', '-')}{again}"

    def topics(self) -> list[str]:
        """Every topic the case's streams had."""
        return [self.topic(s, g) for s in self.streams for g in range(self.declared.get(s, 0) + 1)]

    def rewrite_options(self, options: str) -> str:
        """A view's WITH (...) with the stream a transform writes renamed: outputfunc = insert_into_stream('s')."""
        return re.sub(
            r"\b(insert_into_stream)\(\s*'(\w+)'",
            lambda m: f"{m.group(1)}('{self.streams.get(m.group(2).lower(), m.group(2))}'",
            options,
            flags=re.I,
        )

    def rewrite(self, text: str, *, qualify_relations: bool) -> str:
        """`text` with streams renamed and, in definitions, the case's views and tables schema-qualified.

        Identifiers only (not inside strings or comments, not after a '.'); a view or table only where
        a FROM list names a relation (a column `v` of a view `v` stays); `output_of('v')` too.
        """
        for qualified, renamed in self.streams.items():  # a stream in a schema: PipelineDB's, one name here
            if "." in qualified:
                text = re.sub(rf"(?<![\w.]){re.escape(qualified)}\b", renamed, text, flags=re.I)
        tokens = [t for t in _scan_all(text) if t.name not in _SKIPPED_TOKENS]
        out, last, in_from = [], 0, False
        for index, token in enumerate(tokens):
            word = text[token.start : token.end + 1]
            before = tokens[index - 1].name if index else ""
            if token.name in ("FROM", "JOIN"):
                in_from = True
            elif token.name in _FROM_ENDS:
                in_from = False
            if token.name == "SCONST" or not re.fullmatch(r"\w+", word):
                continue
            name = word.lower()
            if before == "ASCII_46":  # `schema.stream`: PipelineDB's streams live in schemas, these have one name
                if name in self.streams and index >= 2 and tokens[index - 2].start >= last:
                    out.append(text[last : tokens[index - 2].start] + self.streams[name])
                    last = token.end + 1
                elif name in self.tables | self.views and index >= 2 and tokens[index - 2].start >= last:
                    qualifier = text[tokens[index - 2].start : tokens[index - 2].end + 1].lower()
                    if qualifier in self.aliases:  # the case's search_path schema: the run's schema here
                        out.append(text[last : tokens[index - 2].start] + f"{self.schema}.{name}")
                        last = token.end + 1
                continue
            new = self.streams.get(name)
            relation = in_from and before in ("FROM", "JOIN", "ASCII_44")
            if new is None and qualify_relations and relation and (name in self.views or name in self.tables):
                new = f"{self.schema}.{name}"
            if new is not None:
                out.append(text[last : token.start] + new)
                last = token.end + 1
        out.append(text[last:])
        result = "".join(out)
        return re.sub(  # a view named in a string: output_of('v'), pipelinedb.truncate_continuous_view('v')
            r"\b(output_of|truncate_continuous_view|activate|deactivate)\(\s*'(\w+)'",
            lambda m: (
                f"{m.group(1)}('{self.schema}.{m.group(2).lower()}'" if m.group(2).lower() in self.views else m.group(0)
            ),
            result,
            flags=re.I,
        )


# Tokens that end a FROM list (after them a name is not a relation).
_FROM_ENDS = frozenset(
    {
        "WHERE",
        "GROUP_P",
        "HAVING",
        "ORDER",
        "LIMIT",
        "ON",
        "USING",
        "WINDOW",
        "UNION",
        "EXCEPT",
        "INTERSECT",
        "ASCII_41",
        "ASCII_59",
        "SELECT",
        "OFFSET",
    }
)


def _scan_all(text: str) -> list:
    try:
        return scan(text)
    except Exception:
        return []


def code_of(text: str) -> str:
    """`text` without its comments (they name internals in prose, which is no reason to skip)."""
    out, last = [], 0
    for token in _scan_all(text):
        if token.name in _SKIPPED_TOKENS:
            out.append(text[last : token.start])
            last = token.end + 1
    out.append(text[last:])
    return "".join(out).strip()


def unsupported_reason(text: str) -> str | None:
    """Why a statement has no meaning here (PipelineDB's internals), or None."""
    code = code_of(text)
    for pattern, reason in INTERNALS:
        if pattern.search(code):
            return reason
    return None


def translate(statements: list[Statement], names: Names) -> list[Step]:
    """The steps of a case, in order; names (streams, views, tables) are recorded in `names` as met."""
    steps = []
    for statement in statements:
        steps.append(_step(statement, names))
    return steps


def _step(statement: Statement, names: Names) -> Step:
    text = code_of(statement.text).rstrip("; \n\t")  # PipelineDB's cases end some statements with ';;'
    if (path := re.match(r"\s*SET\s+search_path\s+TO\s+(\w+)", text, re.I)) and path.group(1).lower() in names.schemas:
        names.aliases.add(path.group(1).lower())
    if ttl_step := _ttl_call(statement, text, names):
        return ttl_step
    reason = unsupported_reason(text)
    if reason is not None:  # named, so that what reads it is skipped too
        created = _FOREIGN_TABLE.match(text) or _CREATE_VIEW.match(text)
        name = (created.group(1) if _FOREIGN_TABLE.match(text) else created.group(2)).lower() if created else ""
        return Step("unsupported", statement, reason=reason, source=name)
    if m := _FOREIGN_TABLE.match(text):
        return _stream(statement, names, m.group(1).lower(), m.group(2), m.group(3))
    if m := _CREATE_VIEW.match(text):
        # A quoted name ("MyTTLCV") is passed as written: the catalog says what it takes.
        name, options, body = m.group(2).lower() if m.group(2)[0] != '"' else m.group(2), m.group(3) or "", m.group(4)
        if not _reads_a_stream(body, names):
            names.tables.add(name)
            return Step(
                "sql",
                statement,
                sql=f"CREATE VIEW {names.schema}.{name} {options} AS " + names.rewrite(body, qualify_relations=True),
                name=name,
            )
        transform = re.search(r"action\s*=\s*'?transform", options, re.I) is not None
        options = names.rewrite_options(options)
        verb = "CREATE VIEW" if transform else "CREATE CONTINUOUS VIEW"
        reads_stream = bool(set(re.findall(r"\w+", body.lower())) & set(names.streams))
        if not transform and reads_stream:  # a PipelineDB view sees the events after its creation, not history
            options = options[:-1] + ", backfill = 'none')" if options else "WITH (backfill = 'none')"
        verb = verb.replace("CREATE", "CREATE OR REPLACE") if m.group(1) else verb
        for type_ in names.types:  # a cast to the case's type, as the runner finds it
            body = re.sub(rf"::\s*{type_}\b", f"::{names.schema}.{type_}", body, flags=re.I)
        sql = f"{verb} {names.schema}.{name} {options} AS " + names.rewrite(body, qualify_relations=True)
        names.views.add(name)
        return Step("view", statement, sql=sql, name=f"{names.schema}.{name}", source=name.strip('"').lower())
    if m := _DROP.match(text):
        kind = "drop_stream" if m.group(1).upper().startswith("FOREIGN") else "drop_view"
        targets = [t.strip().lower() for t in m.group(3).split(",")]
        targets = [t if t in names.streams else t.split(".")[-1] for t in targets]
        if kind == "drop_stream" and all(t in names.streams for t in targets):
            return Step(kind, statement, name=",".join(names.streams[t] for t in targets))
        if kind == "drop_view" and all(t in names.views for t in targets):
            return Step(kind, statement, name=",".join(f"{names.schema}.{t}" for t in targets))
        return Step("sql", statement, sql=names.rewrite(text, qualify_relations=True))
    if (m := _ALTER_VIEW.match(text)) and m.group(1).lower() in names.views:
        old, new = m.group(1).lower(), m.group(3).lower()
        renamed = m.group(2).upper().startswith("RENAME")
        if renamed:
            names.views.add(new)
        target = f"{names.schema}.{new}" if renamed else f"{new}.{old}"
        return Step("rename_view", statement, sql=target, name=f"{names.schema}.{old}")
    if (m := _DROP_SCHEMA.match(text)) and m.group(1).lower() in names.schemas:
        return Step("drop_schema", statement, sql=names.rewrite(text, qualify_relations=False), name=m.group(1).lower())
    for schema in re.findall(
        r"\bCREATE\s+SCHEMA\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)|\bALTER\s+SCHEMA\s+\w+\s+RENAME\s+TO\s+(\w+)", text, re.I
    ):
        names.schemas.update(n.lower() for n in schema if n)
    if renamed := re.match(r"\s*ALTER\s+SCHEMA\s+(\w+)\s+RENAME\s+TO\s+(\w+)", text, re.I):  # its streams too
        old, new = renamed.group(1).lower(), renamed.group(2).lower()
        for stream, name in list(names.streams.items()):
            if stream.startswith(f"{old}."):
                names.streams[f"{new}.{stream.split('.', 1)[1]}"] = name
    if m := (_CREATE_TABLE.match(text) or _CREATE_OTHER.match(text)):
        names.tables.add(m.group(1).lower())
        if re.match(r"\s*CREATE\s+TYPE\b", text, re.I):
            names.types.add(m.group(1).lower())
    # PostgreSQL 14 removed the postfix factorial (`6!`): the same number is factorial(6).
    text = re.sub(r"(?<![\w.'])(\d+)\s*!(?!=)", r"factorial(\1)", text)
    return Step("sql", statement, sql=names.rewrite(text, qualify_relations=False))


def _stream(statement: Statement, names: Names, name: str, columns: str, rest: str) -> Step:
    if rest.strip():
        return Step("unsupported", statement, reason=f"stream options of PipelineDB ({rest.strip()[:40]})")
    # Streams have one name here: `schema.s` is `schema_s`, apart from `s` and from `other.s`.
    renamed = f"{name.replace('.', '_')}_{names.suffix}"
    if name in names.streams:
        names.declared[name] = names.declared.get(name, 0) + 1
    names.streams[name] = renamed
    if "." in name:  # `schema.s` is read unqualified too (`s.id`, `FROM t, schema.s WHERE s.x = ...`)
        names.streams.setdefault(name.split(".")[-1], renamed)
    for type_ in names.types:  # the runner finds a type of the case's schema by its qualified name only
        columns = re.sub(rf"(\w\s+){type_}\b", rf"\g<1>{names.schema}.{type_}", columns, flags=re.I)
    # PipelineDB gives every stream an arrival_timestamp, the time of the INSERT: here a column of that
    # name, filled by the stream relation's DEFAULT when the row is inserted.
    sql = (
        f"CREATE STREAM {renamed} ({columns}, arrival_timestamp timestamptz DEFAULT now()) WITH (topic = "
        f"'{names.topic(name)}', consumer_group = '{names.group}', partitions = 1)"
    )
    return Step("stream", statement, sql=sql, name=renamed, source=name)


_TTL_CALL = re.compile(r"^\s*SELECT\s+(?:0\s*\*\s*)?pipelinedb\.(set_ttl|ttl_expire)\s*\(", re.I)


def _ttl_call(statement: Statement, text: str, names: Names) -> Step | None:
    """PipelineDB's set_ttl(view, ttl, column) and ttl_expire(view): a step `set_ttl` or `ttl_expire`, or None.

    set_ttl is `ALTER CONTINUOUS VIEW ... SET (ttl, ttl_column)` here (RESET both when they are NULL);
    ttl_expire runs the runner's expiry of the view's stream now, as PipelineDB's did instead of
    waiting for its reaper.
    """
    m = _TTL_CALL.match(text)
    if m is None:
        return None
    node = pglast.parse_sql(text)[0].stmt.targetList[0].val
    call = node.rexpr if isinstance(node, ast.A_Expr) else node
    args = [None if a.isnull else str(getattr(a.val, "sval", getattr(a.val, "ival", ""))) for a in call.args]
    view = (args[0] or "null").strip('"')
    name = f"{names.schema}.{view.lower() if view.lower() in names.views else view}"
    if m.group(1).lower() == "ttl_expire":
        return Step("ttl_expire", statement, name=name)
    given = zip(("ttl", "ttl_column"), args[1:], strict=False)
    options = [f"{k} = " + "'" + v.replace("'", "''") + "'" for k, v in given if v is not None]
    change = f"SET ({', '.join(options)})" if options else "RESET (ttl, ttl_column)"
    return Step("set_ttl", statement, sql=f"ALTER CONTINUOUS VIEW {name} {change}", name=name)


def _reads_a_stream(body: str, names: Names) -> bool:
    """A PipelineDB 1.0 `CREATE VIEW` is continuous when it reads a stream, a continuous view or output_of."""
    words = {t.lower() for t in re.findall(r"\w+", body)}
    return bool(words & set(names.streams)) or bool(words & names.views) or "output_of" in words


def load(name: str) -> list[Statement]:
    """A committed case (tests/pipelinedb_regress/cases/<name>.out), read."""
    return read_case((CASES / f"{name}.out").read_text())
