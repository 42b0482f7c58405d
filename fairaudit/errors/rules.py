"""Rules for typed setting values: each refuses a value with a short phrase naming what it accepts, and
`check_fields` raises every problem of a group of settings (`probe.*`, `backend.*`) as one AuditError line.
Probes check their settings with them in their constructors, backends in their `check`."""

from __future__ import annotations

import string
from typing import Any, Callable, Sequence

from fairaudit.errors import AuditError

ABSENT = object()


MIN_BOOT = 100                 # fewer bootstrap resamples give meaningless percentile intervals
# Bounds on the settings whose cost grows without limit (docs/reliability.md gives their times): past them a run
# takes hours to days and its numbers barely change.
MAX_BOOT = 100_000             # bootstrap resamples of one interval
MAX_RELABELINGS = 1_000_000    # a permutation test's relabelings
MAX_SAMPLES = 100              # model continuations drawn per prompt
MAX_CUTS = 100                 # depth reads per trace (each re-reads the trace's prefix)
MAX_CONTEXT = 262_144          # tokens of context a model is given (every token budget is below it)
MAX_CANARY = 1_024             # characters of a planted canary string


ARM_FAMILIES = ("decision", "mcq")


Check = Callable[[Any], "str | None"]


def integer(lo: int | None = None, hi: int | None = None, why: str = "") -> Check:
    """An int (not a bool) in [lo, hi]; `why` explains the bound."""
    def check(value: Any) -> str | None:
        bad = isinstance(value, bool) or not isinstance(value, int)
        bad = bad or (lo is not None and value < lo) or (hi is not None and value > hi)
        return f"must be an integer{_bounds(lo, hi)}{why}" if bad else None
    return check


def number(lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> Check:
    """A finite int or float in [lo, hi] ((lo, hi] when lo_open)."""
    def check(value: Any) -> str | None:
        bad = isinstance(value, bool) or not isinstance(value, (int, float)) or value != value
        if not bad:
            bad = (lo is not None and (value <= lo if lo_open else value < lo)) or (hi is not None and value > hi)
        return f"must be a number in {'(' if lo_open else '['}{lo}, {hi}]" if bad else None
    return check


def text(empty: bool = False, null: bool = False, longest: int | None = None) -> Check:
    """A string (non-empty unless `empty`; None too when `null`) of at most `longest` characters."""
    def check(value: Any) -> str | None:
        if value is None and null:
            return None
        if not isinstance(value, str) or (not empty and not value.strip()):
            return "must be a non-empty string" if not empty else "must be a string"
        if longest is not None and len(value) > longest:
            return f"must be a string of at most {longest} characters, not {len(value)}"
        return None
    return check


def one_of(*choices: Any) -> Check:
    return lambda value: None if value in choices else f"must be one of {list(choices)}"


def boolean(value: Any) -> str | None:
    return None if isinstance(value, bool) else "must be true or false"


def optional(inner: Check) -> Check:
    return lambda value: None if value is None else inner(value)


def list_of(inner: Check, nonempty: bool = True) -> Check:
    def check(value: Any) -> str | None:
        if not isinstance(value, (list, tuple)) or (nonempty and not value):
            return "must be a non-empty list"
        problems = [inner(item) for item in value]
        return next((f"items {p}" for p in problems if p), None)
    return check


def _bounds(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f" in {lo}..{hi}"
    return f" >= {lo}" if lo is not None else (f" <= {hi}" if hi is not None else "")


def template_fields(allowed: set[str], required: set[str]) -> Check:
    """A str.format template whose fields are among `allowed` and include `required`."""
    def check(value: Any) -> str | None:
        if not isinstance(value, str):
            return "must be a string"
        try:
            fields = {name for _, name, _, _ in string.Formatter().parse(value) if name is not None}
        except ValueError as error:
            return f"is not a valid template ({error})"
        if not fields <= allowed or not required <= fields:
            return f"must use the fields {sorted(required)} (allowed: {sorted(allowed)}), not {sorted(fields)}"
        return None
    return check


def arm_rules(max_new_tokens: Check = integer(1)) -> dict[str, Check]:
    """The checks of an arm's fields (the grid's `arm`, or one a probe asks under, e.g. its `baseline_arm`)."""
    return {"name": text(), "think": boolean, "max_new_tokens": max_new_tokens, "family": one_of(*ARM_FAMILIES)}


def plain(node: Any) -> Any:
    """A config node as plain dicts and lists (anything else as it is)."""
    if not type(node).__module__.startswith("omegaconf"):
        return node
    from omegaconf import DictConfig, ListConfig, OmegaConf

    return OmegaConf.to_container(node) if isinstance(node, (DictConfig, ListConfig)) else node


def field_problems(prefix: str, values: Any, rules: dict[str, Check]) -> list[str]:
    """`prefix.key=value problem` for each dotted key of `rules` that `values` (a mapping) holds."""
    problems, given = [], plain(values)
    for key, check in rules.items():
        value = given
        for part in key.split("."):
            value = value.get(part, ABSENT) if isinstance(value, dict) else ABSENT
        if value is not ABSENT:
            problem = check(value)
            if problem:
                problems.append(f"{prefix}.{key}={value!r} {problem}")
    return problems


def check_fields(prefix: str, values: Any, rules: dict[str, Check], extra: Sequence[str | None] = ()) -> None:
    """Raise one AuditError listing every problem of `values` under `rules` (and the `extra` ones given)."""
    problems = field_problems(prefix, values, rules) + [p for p in extra if p]
    if problems:
        raise AuditError("; ".join(problems))


def port_problem(key: str, url: str) -> str | None:
    """A server URL (`key` names the setting) whose port is not a number (`postgresql://u@h:abc/db`): the line that
    says so and how to write it; None when its port reads (or it has none). The URL's password is hidden."""
    from urllib.parse import urlsplit

    from fairaudit.errors.secrets import redact

    try:
        urlsplit(url).port
    except ValueError:
        port = urlsplit(url).netloc.rpartition("@")[2].rpartition(":")[2]
        return (f"{key}={redact(url)!r}: its port {port!r} is not a number in 0..65535: write the server's port "
                f"after its host (host:5432), or leave ':{port}' out for the default port")
    return None
