"""A definitions text split into statements: each with its number and line, for error messages.

pglast's scanner (not its parser, which does not know CREATE STREAM) finds the semicolons that end
statements, so a semicolon inside a string or comment does not split.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pglast

from pipelines.cv.definitions import DefinitionError, parse

# Scanner tokens that are not part of a statement's text: comments and the semicolons between statements.
_NOT_STATEMENT = frozenset({"SQL_COMMENT", "C_COMMENT", "ASCII_59"})
_HEAD = re.compile(
    r"\s*(CREATE(?:\s+OR\s+REPLACE)?|ALTER|DROP)\s+(STREAM|CONTINUOUS\s+VIEW)\s+(?:IF\s+EXISTS\s+)?([^\s(;,]+)",
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

    def prefix(self, count: int) -> str:
        """How an error names the statement: `statement 2 (line 7): CREATE STREAM x: ` (position only if many)."""
        where = f"statement {self.number} (line {self.line}): " if count > 1 else ""
        return where + (f"{self.label}: " if self.label else "")


def split_statements(text: str) -> list[str]:
    """The statements of a definitions text, each from its first keyword to its end (no semicolon).

    Raises:
        DefinitionError: As `numbered_statements`.
    """
    return [statement.text for statement in numbered_statements(text)]


def numbered_statements(text: str) -> list[Statement]:
    """Split a definitions text into statements, failing on any text that belongs to no statement.

    pglast's scanner (not its parser, which does not know CREATE STREAM) finds the semicolons that end
    statements, so a semicolon inside a string or comment does not split. It passes over what it
    cannot split (a statement whose parentheses do not balance and all after it, a statement that
    does not start with a keyword), so every token of the text must fall in a statement: the first
    that does not is reported, with PostgreSQL's own syntax error when there is one. Comments
    between and before statements are dropped.

    Raises:
        DefinitionError: An unterminated quote, comment or dollar-quoted string, or text that is not
            a complete statement.
    """
    statements, stray = split_with_stray(text)
    if stray is not None:
        start, end, before = stray
        rest = Statement(before + 1, _line(text, start), text[start:end].strip())
        prefix = rest.prefix(len(statements) + 1)
        try:
            parse(rest.text, {})  # PostgreSQL's own syntax error, when there is one
        except DefinitionError as e:
            raise DefinitionError(f"{prefix}{e}") from e
        raise DefinitionError(f"{prefix}incomplete statement")
    return statements


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
            statements.append(Statement(len(statements) + 1, _line(text, start), text[start : piece.stop]))
    return statements, stray


def significant_tokens(text: str) -> list[pglast.parser.Token]:
    """The scanner's tokens of the text but comments and semicolons."""
    try:
        return [token for token in pglast.parser.scan(text) if token.name not in _NOT_STATEMENT]
    except pglast.parser.ParseError as e:
        raise DefinitionError(f"syntax error: {e}") from e


def _line(text: str, position: int) -> int:
    return text.count("\n", 0, position) + 1
