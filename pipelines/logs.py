"""Structured logging for every service and command, configured once in `main()`.

Events are emitted as JSON lines (one object per line: `event`, `level`, `timestamp`, `logger`
and the fields passed as keywords) so supervisord's log files and any shipper can parse them. On a
terminal the same events are rendered for people; `LOG_FORMAT=json|console` forces either.
"""

from __future__ import annotations

import logging
import sys

import structlog

from pipelines.settings import LogSettings


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is at each record, not the one at configuration.

    A command run in-process (a test, or a tool that redirects stderr) may replace and close the
    stream it was configured with; a handler bound to it then fails on every later record.
    """

    @property  # type: ignore[override]
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def configure_logging(settings: LogSettings | None = None) -> None:
    """Route stdlib and structlog records through one renderer on stderr."""
    settings = settings or LogSettings()
    renderer: structlog.typing.Processor
    if settings.format == "console" or (settings.format is None and sys.stderr.isatty()):
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        renderer = structlog.processors.JSONRenderer()
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=True,
    )
    handler = _StderrHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[
                structlog.stdlib.ProcessorFormatter.remove_processors_meta,
                structlog.processors.format_exc_info,
                renderer,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.level)
    # One INFO line per HTTP request is noise; their warnings and errors still show.
    for client in ("httpx", "elastic_transport"):
        logging.getLogger(client).setLevel(max(logging.WARNING, root.level))


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """A logger named after its step; safe to call at import time (configuration is lazy)."""
    return structlog.stdlib.get_logger(name)
