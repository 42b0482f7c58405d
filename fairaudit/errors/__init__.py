"""What a user sees when something is wrong: `AuditError`, the one error type shown as a single line, and how any
error becomes that line; the rules that turn a bad setting into such a line (`rules`); secrets hidden wherever
text is shown or logged (`secrets`); Ctrl-C, SIGTERM and SIGHUP (`interrupt`); a full disk (`disk`); a database
another process keeps locked (`locks`). The lowest layer: it imports no other part of fairaudit and never prints
(the terminal does).
"""

from __future__ import annotations

import argparse
import sys

from fairaudit.errors.secrets import redact


class AuditError(Exception):
    """Bad input or an unusable resource, reported as one line before any model loads; a password in its
    message (a URL's, or one this process has seen) is hidden as it is raised (`secrets.redact`)."""

    def __init__(self, message: str = ""):
        super().__init__(redact(str(message)))


def audit_cause(error: BaseException | None) -> AuditError | None:
    """The AuditError behind `error`: itself, or the one it was raised from (Hydra's instantiate wraps a
    constructor's, and the ImportError of a target whose module raised one when it was imported)."""
    while error is not None and not isinstance(error, AuditError):
        error = error.__cause__
    return error


def input_error_line(error: BaseException) -> str | None:
    """The one line for bad input: an AuditError (also when Hydra's instantiate wrapped it), a target
    that refused its arguments, or a config that does not resolve. None for anything else (a bug)."""
    from hydra.errors import InstantiationException
    from omegaconf.errors import OmegaConfBaseException

    audit = audit_cause(error)
    if audit is not None:
        return one_line(str(audit))
    wrapped = None
    while isinstance(error, InstantiationException) and error.__cause__ is not None:
        wrapped, error = error, error.__cause__
    if wrapped is not None or isinstance(error, OmegaConfBaseException):
        where = f" ({one_line(str(wrapped).splitlines()[0])})" if wrapped is not None else ""
        return one_line(f"{type(error).__name__}: {error}{where}")
    return None


def one_line(message: str) -> str:
    """`message` with its whitespace (newlines included) collapsed and its secrets hidden (`secrets.redact`)."""
    return redact(" ".join(message.split()))


def failure_line(error: BaseException) -> str:
    """Any error as one line: the input error's own line, else its type and message."""
    return input_error_line(error) or one_line(f"{type(error).__name__}: {error}")


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose usage errors are one `error:` line (naming --help) and exit code 2."""

    def error(self, message: str):
        print(f"error: {self.prog}: {one_line(message)} (`{self.prog} --help` shows the usage)", file=sys.stderr)
        sys.exit(2)
