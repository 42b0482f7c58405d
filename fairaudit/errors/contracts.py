"""One mechanism for fairaudit's two extension contracts, `backends.Backend` and `probes.Probe`: a class that leaves
out what its contract requires is refused in one AuditError line naming what it lacks, as early as that can be
known. A declaration (a probe's `needs`) is checked when a concrete class is defined; an abstract method (a
backend's `generate`) when the class is built, or before (`require_complete`, which the job calls before anything
loads); an attribute the constructor must set (a backend's `fingerprint`) as the constructor returns.
"""

from __future__ import annotations

from abc import ABCMeta
from dataclasses import dataclass, field
from typing import Any

from fairaudit.errors import AuditError


@dataclass(frozen=True)
class Terms:
    """What a contract requires of a concrete class, and how its refusal line ends."""

    kind: str                                                  # "backend" or "probe"
    declared: dict[str, type] = field(default_factory=dict)   # class attributes, by the type each must be
    set_by_constructor: tuple[str, ...] = ()                   # instance attributes its constructor sets
    asks: str = ""                                             # what the contract asks, said after the colon


class Contract(ABCMeta):
    """The metaclass of a contract's base class, which sets `terms` (a `Terms`)."""

    terms: Terms

    def __init__(cls, name: str, bases: tuple, namespace: dict, **kwargs: Any):
        super().__init__(name, bases, namespace, **kwargs)
        if bases and not cls.__abstractmethods__:
            lacking = [f"`{attribute}` (a {kind.__name__})" for attribute, kind in cls.terms.declared.items()
                       if not isinstance(getattr(cls, attribute, None), kind)]
            if lacking:
                raise AuditError(f"{_named(cls)} declares no {' and no '.join(lacking)}: {cls.terms.asks}")

    def __call__(cls, *args: Any, **kwargs: Any):
        require_complete(cls)
        built = super().__call__(*args, **kwargs)
        unset = [attribute for attribute in cls.terms.set_by_constructor if not hasattr(built, attribute)]
        if unset:
            raise AuditError(f"{_named(cls)}'s constructor did not set {' and '.join(unset)}: {cls.terms.asks}")
        return built


def require_complete(cls: Contract) -> None:
    """One AuditError line for a contract's class that leaves an abstract method unimplemented (it could not be
    built)."""
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        raise AuditError(f"{_named(cls)} does not implement {', '.join(missing)}: {cls.terms.asks}")


def _named(cls: type) -> str:
    return f"{cls.terms.kind} class {cls.__module__}.{cls.__qualname__}"
