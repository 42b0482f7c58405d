"""Command-line overrides checked before Hydra sees them: a misspelt group option or key is one `error:`
line naming the nearest names (lm-eval's "did you mean"), instead of Hydra's multi-line message."""

from __future__ import annotations

import difflib
from pathlib import Path

from fairaudit import CONF_DIR
from fairaudit.catalog import registry
from fairaudit.cli.credentials import credential_problem, holds_secret
from fairaudit.cli.hints import added_setting_problem, hub_model_hint, keys_named, range_problem, sweep_form

MULTIRUN_FLAGS = ("-m", "--multirun")


def group_options(group: str) -> list[str] | None:
    """The options of a config group of ours (in any config root: `registry.groups`), None for anything else
    (hydra/ plugins)."""
    if group.startswith("hydra") or group not in registry.groups():
        return None
    return registry.names(group)


def nearest(word: str, names: list[str]) -> str:
    """ '; did you mean X?' (or 'X or Y'), or the choices when nothing is near."""
    close = difflib.get_close_matches(word, names, n=2, cutoff=0.6)
    if close:
        return f"; did you mean {' or '.join(close)}?"
    return f"; choices: {', '.join(names)}" if len(names) <= 30 else ""


def values_of(override) -> list[str]:
    """The values an override sets: one, or each value of a sweep (`dataset=adult,compas`)."""
    if override.is_sweep_override():
        return [str(v) for v in override.sweep_string_iterator()]
    return [str(override.value())]


def group_problem(override, options: list[str] | None = None) -> str | None:
    """An option that its group (one of ours, or `options`) does not have."""
    group, ours = override.key_or_group, options is None
    options = group_options(group) if ours else options
    if options is None or override.is_delete() or override.value() is None:
        return None
    if isinstance(override.value(), list):  # dataset=[adult,compas]: brackets make a list, which no group option is
        return (f"{override.input_line}: {group} takes one option; to run several, sweep them without brackets: "
                f"-m {group}={','.join(map(str, override.value()))}")
    for value in values_of(override):
        if "://" in value and ours:  # tracking=http://...: a URL is a value of the group's config, not an option
            keys = sorted({k for name in options for k in registry.settings(group, name) if k in ("uri", "url")})
            return (f"{override.input_line}: {group} picks one of {', '.join(options)}; a URL is a value of it: "
                    f"{' or '.join(f'{group}.{k}=URL' for k in keys) or 'see fairaudit list'}")
        if value not in options:
            listed = " (`fairaudit list` shows them all)" if ours else ""
            return (f"{override.input_line}: there is no {group} named {value!r}{nearest(value, options)}{listed}"
                    f"{hub_model_hint(group, value)}")
    return None


def key_problem(key: str, composed) -> str | None:
    """A dotted key the composed config lacks: the nearest names at the level where it goes astray."""
    from omegaconf import DictConfig

    node, parts = composed, key.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(node, DictConfig):
            return None  # below a value: not a key problem
        if part not in node:
            where = ".".join(parts[:depth])
            names = [f"{where}.{name}" if where else str(name) for name in node.keys()]
            missing = ".".join(parts[:depth + 1])
            deeper = keys_named(parts[-1], node, f"{where}." if where else "")
            hint = f"; did you mean {' or '.join(deeper)}?" if deeper else nearest(missing, names)
            return (f"{key}: the config has no key {missing!r}{hint} (to add a new key on "
                    f"purpose, write +{key}=...)")
        node = node._get_node(part) if hasattr(node, "_get_node") else node[part]
    return None


def credential_line(override) -> str | None:
    """`credentials.credential_problem` of one override (a value, or a list of values to sweep)."""
    if override.is_delete() or override.value() is None or (
            override.is_sweep_override() and not override.is_choice_sweep()):
        return None
    sweep = override.is_sweep_override()
    values = [str(getattr(value, "text", value)) for value in override.value().list] if sweep else \
        [str(override.value())]  # a quoted value's text
    return credential_problem(override.key_or_group.lstrip("+~"), values, sweep)


def settings_problem(override, composed) -> str | None:
    """A group of settings (a mapping such as `store`) given one value (`store=postgresql://h/db`): the key of it
    that the value most likely meant (its `url`, else its first)."""
    from omegaconf import DictConfig, OmegaConf

    from fairaudit.errors.secrets import redact

    node = OmegaConf.select(composed, override.key_or_group, throw_on_resolution_failure=False)
    key = override.key_or_group
    if not isinstance(node, DictConfig) or isinstance(override.value(), dict) or not len(node):
        return None
    names = [str(name) for name in node.keys()]
    meant = "url" if "url" in names else names[0]
    value = redact(override.input_line.partition("=")[2])
    return (f"{key}={value}: {key} is a group of settings ({', '.join(f'{key}.{n}' for n in names[:4])}"
            f"{', ...' if len(names) > 4 else ''}), not one value: write {key}.{meant}={value}")


def job_line(override) -> str:
    """The override as one job of a sweep sees it: a sweep at its first value."""
    if not override.is_sweep_override():
        return override.input_line
    return f"{override.input_line.split('=', 1)[0]}={values_of(override)[0]}"


def check(config_name: str, argv: list[str]) -> str | None:
    """The one error line for overrides that Hydra would not parse (with the fix: `key=value` without spaces, a
    quoted value, -m for a list), that name an unknown option or key, or a list of values without -m (None when
    they compose). A command that prints its config (--cfg job, --info) is checked on its overrides; one with
    Hydra's other flags (-sc, -cn, ...) is left to Hydra."""
    args = [a for a in argv if a not in MULTIRUN_FLAGS]
    problem = flag_problem(args) or hydra_help_problem(args)
    if problem or not args:
        return problem
    args = printed_overrides(args) if any(a.startswith("-") for a in args) else args
    if not args:
        return None
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import OverrideParseException

    try:
        overrides = OverridesParser.create().parse_overrides(args)
    except OverrideParseException as error:
        return parse_problem(args, error)
    problem = next((p for p in map(credential_line, overrides) if p), None) or repeated_problem(overrides) or \
        next((p for p in map(range_problem, overrides) if p), None)
    if problem:
        return problem
    groups = [o for o in overrides if group_options(o.key_or_group) is not None]
    for override in groups:
        problem = group_problem(override)
        if problem:
            return problem
    sweep = [a for a in argv if a in MULTIRUN_FLAGS]
    return compose_problem(config_name, overrides) or list_problem(config_name, sweep + args, overrides)


PRINT_FLAGS = {"--cfg": ("job", "hydra", "all"), "-c": ("job", "hydra", "all"), "--package": None, "-p": None,
                 "--info": ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath"), "--resolve": ()}
PRINT_FLAGS["-i"] = PRINT_FLAGS["--info"]  # Hydra's flags that print the config, and the values they take


def printed_overrides(args: list[str]) -> list[str]:
    """The overrides of a command that prints its config (--cfg job, --info, ...: checked as a run's are, so Hydra's
    own multi-line error never repeats them); none for a command with Hydra's other flags (left to Hydra)."""
    out, skip = [], False
    for num, arg in enumerate(args):
        name, then = arg.split("=", 1)[0], args[num + 1] if num + 1 < len(args) else ""
        if skip or not arg.startswith("-"):
            out += [] if skip else [arg]
            skip = False
            continue
        if name not in PRINT_FLAGS:
            return []
        values = PRINT_FLAGS[name]
        skip = "=" not in arg and (values is None or then in (values or ()))
    return out


HYDRA_FLAGS = ("--cfg", "-c", "--package", "-p", "--info", "-i", "--help", "-h", "--hydra-help", "--resolve",
               "--run", "-r", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd",
               "--experimental-rerun", "--shell-completion", "-sc", "--version")


def flag_problem(args: list[str]) -> str | None:
    """An option Hydra does not have (`--dataset=compas`, `--n 3`): overrides are written key=value."""
    for num, arg in enumerate(args):
        if not arg.startswith("-") or arg.split("=", 1)[0] in HYDRA_FLAGS:
            continue
        key, _, value = arg.lstrip("-").partition("=")
        then = args[num + 1] if num + 1 < len(args) else ""
        value = value or (then if then and not then.startswith("-") and "=" not in then else "")
        if not value:  # a flag of its own: a misspelt -m or Hydra flag
            close = difflib.get_close_matches(arg, [*MULTIRUN_FLAGS, *HYDRA_FLAGS], n=2, cutoff=0.6)
            meant = f"; did you mean {' or '.join(close)}?" if close else ""
            return f"{arg}: fairaudit has no such option{meant} (fairaudit --help lists its flags)"
        return (f"{arg}: fairaudit takes settings as key=value overrides, not as --options: write {key}={value} "
                "(fairaudit --help lists its few flags)")
    return None


def hydra_help_problem(args: list[str]) -> str | None:
    """--hydra-help with overrides: Hydra's own help takes none (and fails composing some)."""
    keys = [a.partition("=")[0] for a in args if not a.startswith("-")]
    if "--hydra-help" not in args or not keys:
        return None
    return (f"--hydra-help prints Hydra's own help and takes no overrides ({', '.join(keys)}): run "
            "fairaudit --hydra-help alone (fairaudit --help for fairaudit's)")


def parse_problem(args: list[str], error: Exception) -> str:
    """Hydra's parse error of the command line as one line naming the override and its fix: `key=value` without
    spaces around `=`, or a value its grammar reads only in quotes (non-ASCII letters, spaces, brackets)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for num, arg in enumerate(args):
        if parses(parser, arg):
            continue
        if "=" not in arg:
            then = args[num + 1:num + 3]
            if then and then[0].startswith("="):
                value = then[1] if then[0] == "=" and len(then) > 1 else then[0].lstrip("=")
                shown = " ".join(then if then[0] == "=" else then[:1])
                return f"{arg} {shown}: write an override without spaces around '=': {arg}={value}"
            owners = [group for group in sorted(registry.groups()) if arg in (group_options(group) or [])]
            meant = f"; did you mean {' or '.join(f'{g}={arg}' for g in owners)}?" if owners else \
                f" (e.g. {arg}=VALUE; ~{arg} deletes a key)"
            return f"{arg}: an override is setting=value{meant}"
        key, value = arg.split("=", 1)
        if not parses(parser, f"{key}=x"):
            return key_grammar_problem(arg, key, value)
        secret = "; better, keep the password off the command line (docs/scale.md, Passwords)" if \
            holds_secret(arg) else ""
        return (f"{arg}: Hydra's override grammar reads this value only in quotes: write "
                f"'{key}=\"{value}\"' (the shell keeps the inner quotes for Hydra){secret}")
    return " ".join(str(error).split())


def parses(parser, arg: str) -> bool:
    """Hydra's override grammar reads `arg`."""
    try:
        parser.parse_overrides([arg])
    except Exception:
        return False
    return True


def key_grammar_problem(arg: str, key: str, value: str) -> str:
    """A key Hydra's grammar does not read: a dotted path mixed with a group's slashes or a `+` inside. A sweep
    param's own key (`hydra.sweeper.params.+experiment/engines/engine`) is set as the override it sweeps."""
    swept = key.removeprefix("hydra.sweeper.params.")
    if swept != key:
        return (f"{arg}: a sweep param is set on the command line as its own override, which replaces the config's "
                f"list: write '{swept}={value}'")
    return (f"{arg}: Hydra's override grammar reads no key {key!r}: a key is a dotted path (a.b.c) or a config "
            "group (a/b), with at most one leading + or ~")


def repeated_problem(overrides) -> str | None:
    """A list of values set again later on the command line (`-m dataset=adult,compas dataset=credit`): Hydra keeps
    the last and says nothing, so the whole list is silently dropped. (A single value set again is how scripts and
    make append their own: the last one wins, as Hydra documents.)"""
    lists: dict[tuple, str] = {}
    for override in overrides:
        key = (override.key_or_group.lstrip("+~"), override.package)
        if key in lists:
            return (f"{key[0]} is set twice ({lists[key]} and {override.input_line}): Hydra would keep only the last "
                    f"and drop the list; sweep one list: {key[0]}=a,b,c with -m")
        if override.is_sweep_override():
            lists[key] = override.input_line
    return None


def list_problem(config_name: str, argv: list[str], overrides) -> str | None:
    """A list of values (`dataset=adult,compas`) on a command that does not sweep: Hydra's "Ambiguous value" as
    one line saying to add -m (an audit) or to write the list in brackets."""
    listed = [o for o in overrides if o.is_sweep_override()]
    if not listed or any(a in MULTIRUN_FLAGS for a in argv) or (config_name == "config" and sweeps_itself(argv)):
        return None
    line = listed[0].input_line
    key, value = line.split("=", 1)
    sweep = f"add -m to sweep it ({sweep_form(line)})" if config_name == "config" else ""
    if value.startswith(("range(", "choice(", "glob(", "interval(")):
        return f"{line}: a sweep on a command that runs once: {sweep or 'give one value'}"
    return (f"{line}: several values on a command that runs once: {sweep + '; ' if sweep else ''}write "
            f"{key}=[{value}] for a list, or {key}='{value}' in quotes for one value holding commas")


def compose_problem(config_name: str, overrides) -> str | None:
    """Compose one job's config; a key that does not exist, or any other composition error, as one line.
    hydra.* overrides and deletions are left to Hydra."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    registry.store_report_settings()  # the report's config names the probes' report settings (probes.<name>.<key>)
    kept = [o for o in overrides if not o.key_or_group.startswith("hydra") and not o.is_delete()]
    keys = [o for o in kept if group_options(o.key_or_group) is None and not (o.is_add() or o.is_force_add())]
    with initialize_config_dir(CONF_DIR, version_base=None):
        try:
            loader = GlobalHydra.instance().config_loader()
            plugins = [o for o in overrides if o.key_or_group.startswith("hydra/") and not o.is_delete()]
            problem = next((p for p in (group_problem(o, loader.get_group_options(o.key_or_group))
                                        for o in plugins) if p), None)  # e.g. hydra/launcher=joblibb
            if problem:
                return problem
            base = compose(config_name, overrides=[job_line(o) for o in kept if o not in keys])
            problem = next((p for p in (key_problem(o.key_or_group, base) or settings_problem(o, base)
                                        for o in keys) if p), None)
            if problem:
                return problem
            return added_setting_problem(kept, with_settings(base, keys))
        except Exception as error:  # a composition Hydra would refuse: its message, on one line
            return " ".join(str(error).split())
        finally:
            GlobalHydra.instance().clear()
    return None


def with_settings(base, keys):
    """The job's whole config: `base` (composed without the settings `keys`) with them applied as Hydra applies a
    command line's settings once its groups are composed (a second composition costs as much as the first)."""
    import copy

    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    config = copy.deepcopy(base)
    ConfigLoaderImpl._apply_overrides_to_config(OverridesParser.create().parse_overrides([job_line(o) for o in keys]),
                                               config)
    return config


def sweeps_itself(argv: list[str]) -> bool:
    """The command, without -m, picks a study whose config sweeps (`+experiment=seed_sweep` sets
    hydra.sweeper.params): it runs as the sweep it names, as with -m."""
    if any(a in MULTIRUN_FLAGS for a in argv) or not any(a.lstrip("+").startswith("experiment=") for a in argv):
        return False
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides = OverridesParser.create().parse_overrides([a for a in argv if not a.startswith("-")])
    with initialize_config_dir(CONF_DIR, version_base=None):
        try:
            cfg = compose("config", overrides=[job_line(o) for o in overrides], return_hydra_config=True)
        except Exception:  # Hydra says what is wrong with it when it runs
            return False
        finally:
            GlobalHydra.instance().clear()
    return bool(cfg.hydra.sweeper.get("params"))


def tracking_database(argv: list[str]) -> list[str]:
    """`tracking.uri=<a folder>` (a path or file:// URL: MLflow 3 has no file store) as the sqlite database in it,
    `tracking.uri=sqlite:///<folder>/mlflow.db`; a path to a .db or .sqlite file as that database."""
    out = []
    for arg in argv:
        key, _, value = arg.partition("=")
        folder = value and not value.startswith("${") and ("://" not in value or value.startswith("file://"))
        if key.lstrip("+") == "tracking.uri" and folder:
            path = Path(value.removeprefix("file://")).expanduser().absolute()
            database = path if path.suffix in (".db", ".sqlite") else path / "mlflow.db"
            arg = f"{key}=sqlite:///{database}"
        out.append(arg)
    return out


def dry_run_asked(argv: list[str]) -> bool:
    """The command sets dry_run=true (a dry run writes nothing, Hydra's output folders included)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        overrides = OverridesParser.create().parse_overrides([a for a in argv if not a.startswith("-")])
    except Exception:
        return False
    return any(o.key_or_group == "dry_run" and not o.is_sweep_override() and o.value() is True for o in overrides)
