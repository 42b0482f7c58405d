"""Credentials typed on the command line: refused where Hydra would cut them into pieces (an unencoded '@' or '#',
a sweep's commas inside a URL), and otherwise moved into the environment before Hydra sees them, so no override,
folder name, launcher file or resume line carries them (docs/scale.md, Passwords)."""

from __future__ import annotations

import os
import re

from fairaudit.errors.secrets import SCHEME, environment_name, redact, unencoded_problem

ROUTE = "PGPASSWORD or ~/.pgpass (docs/scale.md, Passwords)"


def holds_secret(text: str) -> bool:
    """`text` (an override, a value) shows differently once redacted: a password, token or key is in it."""
    return redact(text) != text


def credential_problem(key: str, values: list[str], sweep: bool) -> str | None:
    """The one line for an override (`key`, the values it sets, whether it sweeps them) whose credential Hydra or a
    driver would cut into pieces that then show: a URL's password holding '@', '#', '?' or '/' unencoded; a sweep
    (`-m`, or a list) whose commas split a URL; a sweep over values that hold passwords, which each job's
    overrides, folder and launcher files would carry."""
    problem = next((p for p in (unencoded_problem(key, value) for value in values) if p), None)
    if problem or not sweep:
        return problem
    if any("://" in value for value in values) and not all(map(whole, values)):
        return (f"{key}: its commas split this value into {len(values)}, not all of them URLs: a comma inside "
                f"a URL (its password's) must be percent-encoded (%2C), or the value quoted ({key}='...'); "
                f"better, keep the password off the command line: {environment_name(key)}, {ROUTE}")
    if any(holds_secret(f"{key}={value}") for value in values):
        return (f"{key}: a sweep over values that hold passwords would write them into each job's overrides, "
                f"folder and launcher files: sweep the values without them, and give libpq the passwords in "
                f"{ROUTE}")
    return None


def whole(value: str) -> bool:
    """A sweep's value that is a URL or a path in full, never a piece of one cut at a comma."""
    return bool(re.match(SCHEME, value)) or (value[:1] in ("/", "~", ".") and "@" not in value)


def into_environment(argv: list[str]) -> list[str]:
    """`argv` with each override whose value holds a credential (`store.url=postgresql://me:PW@db/x`,
    `+backend.api_key=sk-...`) set in the environment variable `environment_name` names and read from there
    (`store.url=${oc.env:FAIRAUDIT_STORE_URL}`): Hydra's overrides, the folders and launcher files it makes of
    them, and the resume line name the variable, never the value. The same key set twice: the last wins, as
    in Hydra."""
    out = []
    for arg in argv:
        value = secret_value(arg)
        if value is None:
            out.append(arg)
            continue
        key = arg.split("=", 1)[0]
        os.environ[environment_name(key)] = value
        out.append(f"{key}=${{oc.env:{environment_name(key)}}}")
    return out


def secret_value(arg: str) -> str | None:
    """The value of an override that sets one plain value holding a credential, as Hydra reads it (quotes
    removed); None for anything else (a flag, a sweep, a list, a deletion, an override Hydra does not read)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if arg.startswith("-") or "=" not in arg or not holds_secret(arg):
        return None
    try:
        (override,) = OverridesParser.create().parse_overrides([arg])
    except Exception:  # not an override Hydra reads: left to Hydra to say so
        return None
    value = override.value()
    if override.is_sweep_override() or override.is_delete() or not isinstance(value, (str, int, float)):
        return None
    return str(value)

