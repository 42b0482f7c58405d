"""Which modules a job's config reaches, traced over a real run: every call of a fairaudit function that is handed
the job's config as a whole (the composed `cfg` Hydra hands the audit's app, its resolved settings, or the `Job` and
`Settings` built from them; not the parts of it a stage is handed as its own, such as `backend.*` for the backend),
in call order, and how often each module is entered (a call into it from a function of another module).

    python scripts/config_trace.py [OVERRIDES...]       e.g. model=tiny_qwen3 dataset.n=2 model.max_think_tokens=8

It runs `fairaudit` in this process (store and tracking database in a temporary folder) and prints the modules
in the order the config first reaches them, each with its entries.
"""

from __future__ import annotations

import sys
import tempfile
from collections import Counter


def carriers(value, seen: set[int]) -> bool:
    """Whether `value` is (part of) the job's config as far as the trace has seen it."""
    return id(value) in seen


WHOLE = {"store", "tracking", "model", "dataset", "probe", "backend", "arm"}  # a dict of these keys: the config


def remember(value, seen: set[int]) -> None:
    """The config as a whole: a config object, a dict holding the config's groups, a `Job` or `Settings`."""
    kind = type(value).__name__
    if kind in ("Job", "Settings", "DictConfig") or (isinstance(value, dict) and WHOLE <= set(value)):
        seen.add(id(value))
        for held in getattr(value, "__dataclass_fields__", ()):  # a Job's or Settings' resolved config
            if isinstance(getattr(value, held), dict) and WHOLE <= set(getattr(value, held)):
                seen.add(id(getattr(value, held)))


def main(argv: list[str]) -> int:
    from fairaudit.cli.main import main as cli

    seen: set[int] = set()
    entries: Counter[str] = Counter()
    order: list[str] = []

    handed: set[int] = set()  # frames that were handed the config: what they return is the config too

    def profile(frame, event, arg):
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("fairaudit"):
            return
        if event == "return":
            if id(frame) in handed:
                remember(arg, seen)
            handed.discard(id(frame))
            return
        if event != "call":
            return
        values = [frame.f_locals[name] for name in frame.f_code.co_varnames[:frame.f_code.co_argcount]
                  if name in frame.f_locals]
        if frame.f_code.co_name == "main" and module == "fairaudit.job.__main__":  # Hydra hands the config here
            remember(values[0], seen)
        if not any(carriers(v, seen) for v in values):
            return
        handed.add(id(frame))
        if frame.f_back is None or frame.f_back.f_globals.get("__name__") != module:
            entries[module] += 1
        if module not in order:
            order.append(module)

    with tempfile.TemporaryDirectory() as tmp:
        args = [f"store.url={tmp}/store.sqlite", f"tracking.uri=sqlite:///{tmp}/mlflow.db",
                f"hydra.run.dir={tmp}/outputs", *argv]
        sys.setprofile(profile)
        try:
            code = cli(args)
        finally:
            sys.setprofile(None)
    print(f"the job's config reached {len(order)} modules (exit code {code}):")
    for module in order:
        print(f"  {module}: entered {entries[module]} time(s)")
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
