"""One exception root for the project, with a short subclass per area.

Driver errors are chained (`raise ... from e`) so the cause survives; messages name the step and the
offending value.
"""


class StreamviewsError(Exception):
    """Root of every error this project raises on purpose."""


class ConfigurationError(StreamviewsError):
    """A setting is missing or inconsistent."""


class StackError(StreamviewsError):
    """The local stack could not be installed, started or reached."""


class DatabaseSetupError(StreamviewsError):
    """Roles, database or migrations could not be applied."""
