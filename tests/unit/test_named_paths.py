"""Every file and module a doc, a comment or a docstring names exists: a newcomer follows them.

Paths (`pipelines/cv/engine.py`, `sql/functions/audit.sql`) are looked for in every tracked text
file; dotted modules (`pipelines.cv.engine`, `python -m loadgen.social`) in prose only: Markdown,
Python comments and strings, SQL comments. An applied migration cannot change (its checksum is
kept), so the names its comments got wrong since are listed here with what they are now.
"""

from __future__ import annotations

import io
import re
import subprocess
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TEXT = (".md", ".py", ".sql", ".yml", ".yaml", ".toml", ".c")
PATH = re.compile(
    r"(?<![\w./-])((?:pipelines|loadgen|stack|sql|pgext|es|connectors|monitoring|docs|tests|docker)/[\w./-]*\w"
    r"\.(?:py|sql|md|json|ya?ml|c|ndjson|xml|conf|control|sh|png|properties))\b"
)
# Not within an f-string's braces (code), nor a logger's name (`stack.kafka-probe`).
MODULE = re.compile(r"(?<![\w./{(-])((?:pipelines|loadgen|stack)(?:\.[A-Za-z_]\w*)+)(?![\w-])")
NOT_MODULES = {"stack.env"}  # the local stack's client settings file, .state/stack.env
# Applied migrations keep their text: what their comments name that has moved since.
MOVED_IN_MIGRATIONS = {
    "pipelines/cv/aggregate_calls.py": "pipelines/cv/frontend/aggregate_calls.py",
    "pipelines.cv.windows": "pipelines.cv.views.windows",
    "pipelines/cdc/app_database.py": "pipelines/cdc/captured_tables.py",
}


def tracked() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    this = Path(__file__).resolve().relative_to(ROOT).as_posix()  # names the moved paths on purpose
    return [ROOT / n for n in names if (n.endswith(TEXT) or n == "Makefile") and n != this]


def prose(path: Path, text: str) -> str:
    """The parts of a file that are written for people: all of Markdown, comments and strings elsewhere."""
    if path.suffix == ".md":
        return text
    if path.suffix == ".sql":
        return "\n".join(line.partition("--")[2] for line in text.splitlines())
    if path.suffix == ".py":
        try:
            tokens = tokenize.generate_tokens(io.StringIO(text).readline)
            return "\n".join(t.string for t in tokens if t.type in (tokenize.COMMENT, tokenize.STRING))
        except (tokenize.TokenError, SyntaxError):
            return ""
    return ""


def module_exists(dotted: str) -> bool:
    """A module or package, or a name defined at the top of one (`pipelines.settings.PipelineSettings`)."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:i])
        source = base.with_suffix(".py") if base.with_suffix(".py").exists() else base / "__init__.py"
        if source.exists():
            rest = parts[i:]
            if not rest or rest[0] in ("py", "md", "sql"):
                return True
            name = re.escape(rest[0])
            definition = rf"^(?:(?:async\s+)?def|class)\s+{name}\b|^{name}\s*[:=]|^from .* import .*\b{name}\b"
            return re.search(definition, source.read_text(), re.MULTILINE) is not None
    return False


def missing_names() -> dict[str, set[str]]:
    missing: dict[str, set[str]] = {}
    for path in tracked():
        if not path.exists():
            continue
        text = path.read_text(errors="replace")
        where = str(path.relative_to(ROOT))
        found = [p for p in PATH.findall(text) if not (ROOT / p).exists()]
        found += [m for m in MODULE.findall(prose(path, text)) if m not in NOT_MODULES and not module_exists(m)]
        for name in found:
            if where.startswith("sql/migrations/") and name in MOVED_IN_MIGRATIONS:
                continue
            missing.setdefault(name, set()).add(where)
    return missing


def test_every_path_and_module_a_doc_or_comment_names_exists():
    assert missing_names() == {}


def test_what_migrations_name_that_moved_still_exists_under_its_new_name():
    for now in MOVED_IN_MIGRATIONS.values():
        assert (ROOT / now).exists() or module_exists(now), now
