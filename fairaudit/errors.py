"""The one error type users see as a single line."""


class AuditError(Exception):
    """Bad input or an unusable resource, reported as one line before any model loads."""
