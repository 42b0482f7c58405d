"""Passwords never leave the process: a password in a URL (`store.url`, `tracking.uri`) is shown as ***.

`hide_password` renders one URL with its password hidden (SQLAlchemy's own rendering for database URLs).
`scrub` hides passwords in any text: every `scheme://user:password@` in it, and every password this
process has seen (`remember`: the command line at start, the resolved config of each job), wherever it
appears, e.g. in a driver's error message. Everything fairaudit prints, logs to MLflow or writes beside a
run passes through `scrub`; Hydra's own copies of the config in a run's output folder are scrubbed in place
(`scrub_hydra_files`). To keep a password out of the command line altogether, see docs/reliability.md.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable
from urllib.parse import unquote

MASK = "***"
MIN_SECRET = 4  # shorter passwords are hidden inside URLs only: as bare text they would mask ordinary words
# scheme://user:password@ as SQLAlchemy reads it: the user has no ':' or '/', the password no '@'
# (Hydra's log lines escape the colons: scheme\://user\:password@)
CREDENTIALS = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.-]*\\?://[^\s:/@'\"\\]*\\?:)(?P<password>[^\s@'\"]*)(?=@)")
DATABASE_SCHEMES = ("postgresql", "mysql", "mssql", "oracle", "sqlite")
_SEEN: set[str] = set()


def hide_password(url: Any) -> str:
    """`url` with its password as ***; a URL without one, or any other text, as it is."""
    text = str(url)
    if text.split("://", 1)[0].split("+", 1)[0] in DATABASE_SCHEMES:
        import sqlalchemy as sa

        try:
            parsed = sa.engine.make_url(text)
        except sa.exc.ArgumentError:
            parsed = None
        if parsed is not None and parsed.password is not None:
            return parsed.render_as_string(hide_password=True)
    return CREDENTIALS.sub(lambda m: m["head"] + MASK, text)


def remember(texts: Iterable[Any]) -> None:
    """Note the passwords of every URL in `texts` (as written and percent-decoded), to hide them anywhere later."""
    for text in texts:
        for match in CREDENTIALS.finditer(str(text)):
            _SEEN.update(s for s in (match["password"], unquote(match["password"])) if len(s) >= MIN_SECRET)


def scrub_logs() -> None:
    """Every log record of this process (Hydra's "Launching jobs" lines, MLflow's, alembic's) scrubbed as it is made."""
    import logging

    make = logging.getLogRecordFactory()
    if getattr(make, "scrubs", False):
        return

    def scrubbed(*args, **kwargs) -> logging.LogRecord:
        record = make(*args, **kwargs)
        record.msg, record.args = scrub(record.getMessage()), ()
        return record

    scrubbed.scrubs = True
    logging.setLogRecordFactory(scrubbed)


def remember_config(node: Any) -> None:
    """`remember` every string of a config (an OmegaConf node, resolved where it resolves, or plain containers)."""
    remember(_strings(_plain(node)))


def scrub(text: str) -> str:
    """`text` with every URL's password and every password remembered replaced by ***."""
    text = CREDENTIALS.sub(lambda m: m["head"] + MASK, text)
    for secret in sorted(_SEEN, key=len, reverse=True):
        text = text.replace(secret, MASK)
    return text


def scrub_tree(node: Any) -> Any:
    """A copy of nested dicts and lists with every string scrubbed (keys too)."""
    if isinstance(node, dict):
        return {scrub_tree(k): scrub_tree(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [scrub_tree(v) for v in node]
    return scrub(node) if isinstance(node, str) else node


def scrub_file(path: Path) -> None:
    """Rewrite a text file with its passwords hidden (in a copy renamed into place), if it holds any."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError):
        return
    clean = scrub(text)
    if clean != text:
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(clean)
        os.replace(partial, path)


def scrub_hydra_files(cfg: Any) -> None:
    """Hydra's copies of this job's config and overrides (<output dir>/.hydra/*.yaml) and a sweep's multirun.yaml,
    scrubbed once the job's passwords are remembered: Hydra wrote them as typed, before any fairaudit code ran."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    remember_config(cfg)
    scrub_logs()  # in a sweep's worker processes too
    if not _SEEN:
        return
    hydra = HydraConfig.get()
    files = []
    if hydra.output_subdir is not None:
        files += sorted((Path(hydra.runtime.output_dir) / hydra.output_subdir).glob("*.yaml"))
    if hydra.mode == RunMode.MULTIRUN:
        files.append(Path(hydra.sweep.dir) / "multirun.yaml")
    for path in files:
        scrub_file(path)


def _plain(node: Any) -> Any:
    if not type(node).__module__.startswith("omegaconf"):
        return node
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(node, resolve=True)
    except Exception:  # an interpolation that does not resolve: its text as written
        return OmegaConf.to_container(node, resolve=False)


def _strings(node: Any) -> Iterable[str]:
    if isinstance(node, dict):
        for value in node.values():
            yield from _strings(value)
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from _strings(value)
    elif isinstance(node, str):
        yield node
