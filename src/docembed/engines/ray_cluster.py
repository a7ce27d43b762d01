"""Joining or starting a Ray cluster and sizing the actor pool to what it holds."""

from __future__ import annotations

import logging
import math
import signal
import threading
from dataclasses import dataclass

from docembed.errors import DocembedError

INSTALL_HINT = "pip install 'docembed[ray]'"


@dataclass
class RayOptions:
    address: str | None = None
    num_workers: int = 1
    cpus_per_worker: float = 1.0
    gpus_per_worker: float = 0.0
    rows_per_shard: int = 10_000


def import_ray():
    try:
        import ray
        import ray.data  # noqa: F401  (the [data] extra: pyarrow, pandas and the Data library)
    except ImportError:
        raise DocembedError(
            f"--engine ray needs Ray, which is not installed: install it with: {INSTALL_HINT}"
        ) from None
    return ray


def connect(ray, options: RayOptions, verbose: bool) -> bool:
    """Join the cluster at --address (or the one this process already joined), else start a local instance
    sized for the workers. Returns whether this call started Ray (and so must shut it down)."""
    level = logging.INFO if verbose else logging.ERROR
    logging.getLogger("ray.data").setLevel(level)
    context = ray.data.DataContext.get_current()
    context.enable_progress_bars = False
    if ray.is_initialized():
        return False
    common = {"log_to_driver": verbose, "logging_level": level}
    # ray.init installs a SIGTERM handler of its own that exits on the spot; keep docembed's, which unwinds
    # like Ctrl-C so the manifest records the finished shards and Ray is shut down.
    on_term = signal.getsignal(signal.SIGTERM)
    try:
        if options.address:
            _probe(options.address)
            ray.init(address=options.address, **common)
        else:
            cpus = max(1, math.ceil(options.num_workers * options.cpus_per_worker))
            ray.init(num_cpus=cpus, include_dashboard=False, **common)
    except ConnectionError as error:
        raise DocembedError(f"cannot reach the Ray cluster at {options.address}: {error}") from None
    finally:
        if on_term is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, on_term)
    return True


def _probe(address: str) -> None:
    """Fail fast, with a message, when nothing listens at a host:port address: ray.init itself retries
    for minutes without a word. The wait is DOCEMBED_RAY_CONNECT_TIMEOUT seconds (default 20)."""
    import os
    import socket

    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():  # "auto", "local": Ray finds the cluster itself
        return
    timeout = float(os.environ.get("DOCEMBED_RAY_CONNECT_TIMEOUT", "20"))
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
    except TimeoutError:
        raise DocembedError(
            f"cannot reach the Ray cluster at {address}: no answer within {timeout:g} s"
        ) from None
    except OSError as error:
        raise DocembedError(f"cannot reach the Ray cluster at {address}: {error.strerror or error}") from None


def pool_size(ray, options: RayOptions, shards: int) -> int:
    """--num-workers, capped by the shards to do and by what the cluster holds (a fixed-size actor pool that
    can never be placed would wait for ever)."""
    from docembed.runtime import log

    resources = ray.cluster_resources()
    fits = [options.num_workers, shards]
    for name, need in (("CPU", options.cpus_per_worker), ("GPU", options.gpus_per_worker)):
        if need:
            have = resources.get(name, 0)
            if have < need:
                flag = "--cpus-per-worker" if name == "CPU" else "--gpus-per-worker"
                raise DocembedError(f"{flag} {need:g}, but the Ray cluster has {have:g} {name}(s)")
            fits.append(int(have // need))
    size = min(fits)
    if size < min(options.num_workers, shards):
        log(f"ray: the cluster has room for {size} of the {options.num_workers} workers asked for")
    return size
