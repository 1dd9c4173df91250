"""A definitions text scanned into statements: each with its number and line, for error messages.

pglast's scanner (not its parser, which does not know CREATE STREAM) finds the semicolons that end
statements, so a semicolon inside a string or comment does not split. How a text that is not made
of whole statements is reported is the front end's (pipelines.cv.frontend.statements).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pglast

from pipelines.cv.model import DefinitionError

# Scanner tokens that are not part of a statement's text: comments and the semicolons between statements.
_NOT_STATEMENT = frozenset({"SQL_COMMENT", "C_COMMENT", "ASCII_59"})
_HEAD = re.compile(
    r"\s*(CREATE(?:\s+OR\s+REPLACE)?|ALTER|DROP)\s+(STREAM|CONTINUOUS\s+VIEW|SINK)\s+(?:IF\s+EXISTS\s+)?([^\s(;,]+)",
    re.IGNORECASE,
)


@dataclass(frozen=True)
class Statement:
    """One statement of a definitions text, with where it starts (for error messages)."""

    number: int
    line: int
    text: str

    @property
    def label(self) -> str:
        """`CREATE STREAM clicks` / `CREATE CONTINUOUS VIEW social.x`: what it defines ("" when unknown)."""
        head = _HEAD.match(self.text)
        if head is None:
            return ""
        return f"{' '.join(head.group(1).upper().split())} {' '.join(head.group(2).upper().split())} {head.group(3)}"

    def position(self, count: int) -> str:
        """Where the statement is among `count`: `statement 2 (line 7): `, or "" when it is the only one."""
        return f"statement {self.number} (line {self.line}): " if count > 1 else ""

    def prefix(self, count: int) -> str:
        """How an error names the statement: `statement 2 (line 7): CREATE STREAM x: ` (position only if many)."""
        return self.position(count) + (f"{self.label}: " if self.label else "")


def split_with_stray(text: str) -> tuple[list[Statement], tuple[int, int, int] | None]:
    """The statements pglast's scanner finds, and the first token in none: (start, end, statements before)."""
    try:
        pieces = pglast.split(text, with_parser=False, only_slices=True)
    except pglast.parser.ParseError as e:
        raise DefinitionError(f"syntax error: {e}") from e
    tokens = significant_tokens(text)
    statements: list[Statement] = []
    stray = None
    i = 0
    for piece in (*pieces, slice(len(text), len(text))):  # the last, empty, catches what follows every statement
        if i < len(tokens) and tokens[i].start < piece.start and stray is None:
            stray = (tokens[i].start, piece.start, len(statements))
        while i < len(tokens) and tokens[i].start < piece.start:
            i += 1
        first = i
        while i < len(tokens) and tokens[i].start < piece.stop:
            i += 1
        if i > first:  # not only comments
            start = tokens[first].start
            statements.append(Statement(len(statements) + 1, line_of(text, start), text[start : piece.stop]))
    return statements, stray


def significant_tokens(text: str) -> list[pglast.parser.Token]:
    """The scanner's tokens of the text but comments and semicolons."""
    try:
        return [token for token in pglast.parser.scan(text) if token.name not in _NOT_STATEMENT]
    except pglast.parser.ParseError as e:
        raise DefinitionError(f"syntax error: {e}") from e


def line_of(text: str, position: int) -> int:
    """The line (from 1) of a position in the text."""
    return text.count("\n", 0, position) + 1
