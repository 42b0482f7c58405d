"""Ray, for a sweep's jobs (`hydra/launcher=ray`, hydra-ray-launcher) and a job's workers (`job.workers_on=ray`):
which cluster (`RAY_ADDRESS`, or the launcher's `ray.init.address`; none: a local Ray started for the sweep),
and whether it answers before anything starts.

Ray is an optional extra (`pip install -e '.[ray]'`), imported only here and only when asked for.
"""

from __future__ import annotations

import os
import signal
import socket
from typing import Mapping

REACH_TIMEOUT_S = 5.0   # a Ray cluster's head must accept a connection within this
INSTALL = "pip install -e '.[ray]'"
# What a job's config reads from the environment: where results live, the data, config roots, and the store and
# tracking locations a credential typed on the command line was moved to (Ray keeps them in the cluster's job table).
FORWARDED = ("FAIRAUDIT_HOME", "FAIRAUDIT_DATA", "FAIRAUDIT_PATH", "FAIRAUDIT_STORE_URL", "FAIRAUDIT_TRACKING_URI",
             "MLFLOW_TRACKING_URI", "OMP_NUM_THREADS")
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)  # the signals that stop a run (errors.interrupt)


def launcher_is_ray(launcher: Mapping) -> bool:
    """A sweep's `hydra.launcher` config is hydra-ray-launcher's."""
    return "hydra_ray_launcher" in str(launcher.get("_target_", ""))


def address_of(init: Mapping | None) -> str | None:
    """The cluster Ray will join: `init.address`, else RAY_ADDRESS, else None (a local Ray started here)."""
    return (init or {}).get("address") or os.environ.get("RAY_ADDRESS") or None


def head_of(address: str) -> tuple[str, int] | None:
    """(host, port) of a cluster address (`host:port` or `ray://host:port`); None for `auto` / `local`."""
    text = address.split("://", 1)[-1]
    if text in ("auto", "local") or ":" not in text:
        return None
    host, _, port = text.rpartition(":")
    return (host.strip("[]"), int(port)) if port.isdigit() else None


def cluster_problem(init: Mapping | None) -> str | None:
    """Why a Ray sweep or worker could not start, in one line, before anything starts: Ray not installed, or a
    cluster address that is malformed or whose head does not answer."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return f"Ray is not installed in this environment: {INSTALL} (hydra-ray-launcher and ray[default])"
    address = address_of(init)
    if not address:
        return None
    head = head_of(address)
    if head is None and address.split("://", 1)[-1] not in ("auto", "local"):
        return f"Ray cluster address {address!r} is not host:port or ray://host:port (RAY_ADDRESS or ray.init.address)"
    if head is None:
        return None
    try:
        with socket.create_connection(head, timeout=REACH_TIMEOUT_S):
            return None
    except OSError as error:
        return (f"the Ray cluster at {address} does not answer ({error.strerror or error}) within "
                f"{REACH_TIMEOUT_S:g} s: start it (`ray start --head`) or set RAY_ADDRESS to one that runs")


def workers_problem(job: Mapping) -> str | None:
    """Why a job's workers could not start on Ray (`job.workers_on=ray`), in one line; None when they can or run
    here."""
    if int(job.get("workers", 1)) > 1 and job.get("workers_on") == "ray":
        return cluster_problem(None)
    return None


def forwarded(runtime_env: Mapping | None) -> dict:
    """Ray's runtime environment for this process's tasks, carrying the FORWARDED variables this process has (a task
    runs in a worker the cluster started, whose environment is the node's): its config then resolves there as here."""
    env = {name: os.environ[name] for name in FORWARDED if name in os.environ}
    runtime_env = dict(runtime_env or {})
    runtime_env["env_vars"] = {**env, **dict(runtime_env.get("env_vars") or {})}
    return runtime_env


def connect(init: Mapping | None = None) -> None:
    """Join the cluster (or start a local Ray) unless this process already has, with `init`'s options of ray.init;
    a cluster that cannot be joined is one AuditError line. The process's own handlers of the signals that stop a
    run stay in place (Ray's driver installs its own)."""
    import ray

    from fairaudit.errors import AuditError

    problem = cluster_problem(init)
    if problem:
        raise AuditError(problem)
    if ray.is_initialized():
        return
    options = {key: value for key, value in dict(init or {}).items() if value is not None}
    options["runtime_env"] = forwarded(options.get("runtime_env"))
    handlers = {number: signal.getsignal(number) for number in STOPS}
    try:
        ray.init(**{"address": address_of(init), "log_to_driver": False, "configure_logging": False, **options})
    except ConnectionError as error:  # a head that answers a port but is no Ray, or not reachable from its nodes
        raise AuditError(f"cannot join the Ray cluster at {address_of(init)}: {error}") from None
    finally:  # Ray's driver takes SIGTERM for itself: a stop is this process's to handle (errors.interrupt)
        for number, handler in handlers.items():
            signal.signal(number, handler)
