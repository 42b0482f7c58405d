"""Secrets never leave the process: whatever fairaudit shows, logs or writes passes through `redact` first.

`redact` works on structure, never on other text. A URL (`scheme://user:password@host/path?query#fragment`) has
its password and every credential-named query or fragment parameter (password, token, key, secret, sslpassword,
...) shown as ***; a setting named like a credential (`backend.api_key`, `password=...`, `password: ...`) has its
value shown as ***. A mapping's keys are names and are never changed, so a password that is also a word (`think`)
cannot touch `backend.thinking.style`. The password of a URL is read both as SQLAlchemy reads a database URL (up
to its first `@`) and as `urllib.parse` reads any other (up to the last `@` before the path): the wider of the
two is hidden, so a password typed without percent-encoding is hidden too.

Text from other programs (a driver's error message) may hold a password bare, outside any URL: the strong
passwords this process has seen (`remember`: at least 8 characters, not letters alone) are hidden there as whole
tokens. Hydra's own copies of a job's config are rewritten through `redact` (`redact_hydra_files`), and the folder
names Hydra makes of a job's overrides (`${hydra.job.override_dirname}`) are redacted as Hydra makes them.

A password never needs the command line: `store.url` and `tracking.uri` default to `$FAIRAUDIT_STORE_URL` and
`$FAIRAUDIT_TRACKING_URI` (`ENVIRONMENT`), and libpq's and MLflow's own variables work as ever (docs/scale.md).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import unquote, unquote_plus

MASK = "***"
STRONG = 8  # a remembered password shorter than this, or of letters alone, is hidden inside URLs and settings only
CREDENTIAL_NAMES = frozenset({
    "password", "passwd", "pwd", "pass", "passphrase", "token", "secret", "key", "apikey", "sslpassword", "sig",
    "signature", "auth", "authorization", "credential", "credentials", "private_key", "client_secret"})
CREDENTIAL_ENDINGS = ("password", "passwd", "secret", "token", "_key", "apikey", "signature", "credential",
                      "credentials")
SCHEME = r"[A-Za-z][A-Za-z0-9+.-]*\\?://"
# a URL runs to the next space or quote, or to where the next URL begins (a sweep's list, Hydra's override_dirname)
URL = re.compile(rf"(?<![A-Za-z0-9+.-])(?P<scheme>{SCHEME})(?P<rest>(?:(?!{SCHEME})[^\s'\"`<>])*)")
# name=value (an override, a libpq keyword, a query parameter) or `name: value` (YAML), the name's last part checked
SETTING = re.compile(r"(?<![\w.-])(?P<name>[A-Za-z_][\w.-]*)(?P<sep>\\?=|:[ \t]+)(?P<value>[^\s'\"&;]+)")
OVERRIDE = re.compile(r"(?P<name>[+~]{0,2}[A-Za-z_][\w.@/-]*)=(?P<value>.*)", re.S)  # a whole command-line override
PARAMETER = re.compile(r"(?P<name>[^?&;#=]+)=(?P<value>[^&;#]*)")
ENVIRONMENT = {"store.url": "FAIRAUDIT_STORE_URL", "tracking.uri": "FAIRAUDIT_TRACKING_URI"}  # where each URL may be
CREDENTIAL_VARIABLES = ("PGPASSWORD", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN", "MLFLOW_TRACKING_URI",
                        *ENVIRONMENT.values())  # the environment's credentials (and URLs holding them)
ENVIRONMENT_READ = re.compile(r"\$\\?\{oc\.env\\?:(?P<name>\w+)\\?\}")  # ${oc.env:NAME}, or as a sweep escapes it
UNENCODED = "@#?/"  # in a URL's password: where some reader of it ends the password (or the host begins)
_SEEN: set[str] = set()


def credential_name(name: Any) -> bool:
    """A setting or parameter whose value is a secret, by the last part of its (dotted) name."""
    last = str(name).rsplit(".", 1)[-1].strip().lstrip("+~").lower().replace("-", "_")
    return last in CREDENTIAL_NAMES or last.endswith(CREDENTIAL_ENDINGS)


def redact(value: Any, key: Any = None, by_name: bool = True) -> Any:
    """`value` as it may be shown: a string with its URLs' passwords and credential parameters hidden; a mapping's
    values (and a list's items) redacted, its keys kept, a value under a credential-named key hidden whole
    (`by_name=False`: names not looked at, for tags, whose names are fairaudit's own); anything else as it is."""
    if by_name and key is not None and credential_name(key) and value not in (None, ""):
        return MASK
    if isinstance(value, Mapping):
        return {k: redact(v, k if by_name else None, by_name) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [redact(v, key, by_name) for v in value]
    if isinstance(value, str):
        return _redact_text(value)
    return value


def _redact_text(text: str) -> str:
    override = OVERRIDE.fullmatch(text)
    if override and credential_name(override["name"]):
        return f"{override['name']}={MASK}"
    text = URL.sub(lambda m: m["scheme"] + _redact_rest(m["rest"]), text)
    text = SETTING.sub(lambda m: m[0] if not credential_name(m["name"]) else m["name"] + m["sep"] + MASK, text)
    for secret in sorted(_SEEN, key=len, reverse=True):
        if secret in text:
            text = re.sub(rf"(?<!\w){re.escape(secret)}(?!\w)", MASK, text)
    return text


def _redact_rest(rest: str) -> str:
    """What follows `scheme://`: the password (read both ways, see the module's docstring) and credential-named
    query and fragment parameters hidden."""
    first_at = rest.find("@")
    user_end = rest.find(":")
    if 0 <= user_end < first_at and "/" not in rest[:user_end]:
        netloc = re.split(r"[/?#]", rest, maxsplit=1)[0]
        end = max(first_at, netloc.rfind("@"))
        rest = rest[:user_end + 1] + MASK + rest[end:]
    marks = [i for i in (rest.find("?"), rest.find("#")) if i >= 0]
    if not marks:
        return rest
    start = min(marks)
    return rest[:start] + PARAMETER.sub(
        lambda m: m["name"] + "=" + MASK if credential_name(unquote_plus(m["name"])) else m[0], rest[start:])


def remember(texts: Iterable[Any]) -> None:
    """Note the strong passwords in `texts` (command-line arguments, config strings): a URL's password, a
    credential-named parameter's or setting's value, as written and percent-decoded, to hide them in any text."""
    for text in map(str, texts):
        found = [m["value"] for m in SETTING.finditer(text) if credential_name(m["name"])]
        for match in URL.finditer(text):
            shown, rest = _redact_rest(match["rest"]), match["rest"]
            found += _differences(rest, shown)
        for secret in found:
            _SEEN.update(s for s in (secret, unquote(secret)) if len(s) >= STRONG and not s.isalpha())


def remember_environment() -> None:
    """`remember` the credentials this process's environment holds (`CREDENTIAL_VARIABLES`)."""
    for name in CREDENTIAL_VARIABLES:
        value = os.environ.get(name, "")
        remember([value if "://" in value else f"password={value}"] if value else [])


def environment_name(key: str) -> str:
    """The environment variable a setting's secret value is kept in: `FAIRAUDIT_STORE_URL` for store.url,
    `FAIRAUDIT_TRACKING_URI` for tracking.uri, `FAIRAUDIT_BACKEND_API_KEY` for backend.api_key."""
    key = key.lstrip("+~")
    return ENVIRONMENT.get(key) or "FAIRAUDIT_" + re.sub(r"\W", "_", key).upper()


def environment_read(argv: Iterable[str]) -> list[str]:
    """The environment variables a command line reads values from (`key=${oc.env:NAME}`), in order."""
    return list(dict.fromkeys(m["name"] for m in ENVIRONMENT_READ.finditer(" ".join(argv))))


def unencoded_problem(key: str, url: str) -> str | None:
    """A URL whose password holds '@', '#', '?' or '/' as typed: SQLAlchemy ends the password at its first '@',
    urllib at the first '#', '?' or '/', so the URL means another host, or a port that is part of the password,
    and the error naming them would show that part. One line naming neither."""
    for match in URL.finditer(url):
        login = re.match(r"(?P<user>[^:/@?#]*):(?P<password>[^@]*)@(?P<host>[^/?#]*)", match["rest"])
        if not login or re.fullmatch(r"\d*", login["password"]) or re.match(r"\d+[/?#]", login["password"]):
            continue  # no password, or host:port/...: no login
        found = sorted({c for c in login["password"] + ("@" if "@" in login["host"] else "") if c in UNENCODED})
        if found:
            encoded = " ".join(f"{c!r} as %{ord(c):02X}" for c in found)
            return (f"{key}: the password in this URL holds {' and '.join(map(repr, found))} unencoded, which ends "
                    f"it early for some readers: percent-encode it ({encoded}), or keep it off the command line "
                    f"in {environment_name(key)}, PGPASSWORD or ~/.pgpass (docs/scale.md, Passwords)")
    return None


def _differences(original: str, shown: str) -> list[str]:
    """The pieces of `original` that `shown` replaced by MASK."""
    pattern = "^" + "(.*?)".join(map(re.escape, shown.split(MASK))) + "$"
    match = re.match(pattern, original, re.S)
    return list(match.groups()) if match else []


def remember_config(node: Any) -> None:
    """`remember` every string of a config (an OmegaConf node, resolved where it resolves, or plain containers),
    and the value of every credential-named key."""
    remember(_strings(_plain(node)))


def redact_logs() -> None:
    """Every log record of this process (Hydra's "Launching jobs" lines, MLflow's, alembic's) redacted as made."""
    import logging

    make = logging.getLogRecordFactory()
    if getattr(make, "redacts", False):
        return

    def redacted(*args, **kwargs) -> logging.LogRecord:
        record = make(*args, **kwargs)
        record.msg, record.args = redact(record.getMessage()), ()
        return record

    redacted.redacts = True
    logging.setLogRecordFactory(redacted)


def redact_yaml_file(path: Path) -> None:
    """Rewrite a YAML file (Hydra's config, overrides, multirun.yaml) through `redact`, in a copy renamed into
    place, when that changes anything."""
    from omegaconf import OmegaConf

    try:
        node = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
    except Exception:  # absent, unreadable: nothing of ours to hide
        return
    shown = redact(node)
    if shown != node:
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        OmegaConf.save(OmegaConf.create(shown), partial)
        os.replace(partial, path)


def redact_hydra_files(cfg: Any) -> None:
    """Hydra's copies of this job's config and overrides (<output dir>/.hydra/*.yaml) and a sweep's multirun.yaml,
    rewritten through `redact`: Hydra wrote them as typed, before any fairaudit code ran."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    remember_config(cfg)
    remember_environment()
    redact_logs()  # in a sweep's worker processes too
    hydra = HydraConfig.get()
    files = []
    if hydra.output_subdir is not None:
        files += sorted((Path(hydra.runtime.output_dir) / hydra.output_subdir).glob("*.yaml"))
    if hydra.mode == RunMode.MULTIRUN:
        files.append(Path(hydra.sweep.dir) / "multirun.yaml")
    for path in files:
        redact_yaml_file(path)


def redact_override_dirname() -> None:
    """Hydra's `${hydra.job.override_dirname}` (folder names made of a job's overrides) made redacted, and without
    the overrides that read a value from the environment (`key=${oc.env:NAME}`: that value names no job)."""
    from hydra._internal import config_loader_impl as loader

    if getattr(loader.get_overrides_dirname, "redacts", False):
        return

    def dirname(overrides, exclude_keys, item_sep, kv_sep) -> str:  # Hydra's, each override redacted
        lines = sorted(redact(o.input_line) for o in overrides
                       if o.key_or_group not in exclude_keys and not ENVIRONMENT_READ.search(o.input_line))
        return item_sep.join(lines).replace("=", kv_sep)

    dirname.redacts = True
    loader.get_overrides_dirname = dirname


def _plain(node: Any) -> Any:
    if not type(node).__module__.startswith("omegaconf"):
        return node
    from omegaconf import OmegaConf

    try:
        return OmegaConf.to_container(node, resolve=True)
    except Exception:  # an interpolation that does not resolve: its text as written
        return OmegaConf.to_container(node, resolve=False)


def _strings(node: Any, key: Any = None) -> Iterable[str]:
    if isinstance(node, dict):
        for name, value in node.items():
            yield from _strings(value, name)
    elif isinstance(node, (list, tuple)):
        for value in node:
            yield from _strings(value, key)
    elif isinstance(node, str):
        yield f"{key}={node}" if key is not None and credential_name(key) else node
