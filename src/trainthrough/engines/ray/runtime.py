"""Starting and joining Ray, on loopback unless the user asks otherwise.

A local cluster listens on 127.0.0.1 only. Ray advertises the machine's external
address even with ``_node_ip_address="127.0.0.1"``;
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` binds every listener to 127.0.0.1 (set before
Ray is imported: the package's ``LOOPBACK_ENV``, and again here for callers that
imported Ray first); usage stats are off. A local cluster keeps Ray's default token
authentication; only the warning Ray logs about it on every run is silenced (setting
``RAY_AUTH_MODE`` instead would have to happen before Ray is first imported, which the
caller may already have done).

Ray's session files go under a short temp dir of their own, never under the run
folder: Unix socket paths are limited to 107 bytes and Ray nests sockets several
levels deep, and Ray insists on an absolute path. The temp dir is removed when the
cluster this module started shuts down. Its workers run at the driver's priority, not
Ray's default nice 15 (``RAY_worker_niceness``; see where the cluster starts).

Joining a cluster (``address``) is bounded: the address is checked to accept TCP
connections first, because ``ray.init`` against a closed port retries for minutes.

A worker this project killed on purpose is not reported as Ray's "A worker died ...
killed by the OOM killer ..." paragraph on stdout: the run already reported the failure
it injected (:func:`_quiet_injected_deaths`). Any other death Ray reports is printed.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
from pathlib import Path
from typing import Any

from trainthrough.engines.ray import LOOPBACK_ENV, NAMESPACE
from trainthrough.engines.signals import injected
from trainthrough.errors import UserError

# Longest temp root that leaves room for Ray's nested socket paths (107-byte limit).
_MAX_TEMP_ROOT = 40
CONNECT_SECONDS = 3.0
_started_temp: list[str] = []
_DEAD_PID = re.compile(r"\bWorker PID: (\d+)\b")
#: how long Ray's report of a death waits for it to be known as injected: a rank that
#: carried out its own failure order posted it before dying, and the controller, woken
#: by the post, notes it within a tick (50 ms, gloo/controller.py) unless busy with a
#: recovery step; Ray's report can come first
_KNOWN_WITHIN = 2.0


def _short_temp_root() -> str | None:
    root = tempfile.gettempdir()
    return root if len(root) <= _MAX_TEMP_ROOT else ("/tmp" if os.path.isdir("/tmp") else None)


def check_address(address: str, timeout: float = CONNECT_SECONDS) -> None:
    """Refuse an address that is malformed or does not accept connections.

    Raises:
        UserError: naming the address and what went wrong.
    """
    if address == "auto":
        return  # Ray looks up the cluster this machine started (its own error is clear)
    hostport = address.split("://", 1)[-1]
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isascii() or not port.isdigit() \
            or not 0 < int(port) < 65536:
        raise UserError(f"--ray-address {address!r} must be host:port (e.g. 127.0.0.1:6379) "
                        "or auto")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except OSError as e:
        raise UserError(f"could not reach a Ray cluster at {address}: "
                        f"{e.strerror or e} (is `ray start --head` running there?)") from None


def _host(address: str) -> str:
    return address.split("://", 1)[-1].rpartition(":")[0].strip("[]")


def _loopback_even_if_imported() -> None:
    """Ray reads ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER`` once, when it is imported: a
    caller that imported Ray before us (a notebook, a test module) would otherwise
    get listeners on every interface (0.0.0.0); with this, none."""
    if os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") != "0":
        return  # the user chose otherwise, explicitly
    from ray._private import ray_constants

    ray_constants.ENABLE_RAY_CLUSTER = False


def _every_line_even_if_imported() -> None:
    """Ray reads ``RAY_DEDUP_LOGS`` once, when it is imported: a caller that imported Ray
    before us would get its driver's log deduplication, which folds a death Ray reports
    into an earlier one's "[repeated 2x across cluster]" line (same text but for the
    pids), so that a death this project did not inject goes unreported under another
    worker's pid (:func:`_quiet_injected_deaths` drops the injected ones)."""
    if os.environ.get("RAY_DEDUP_LOGS") != "0":
        return  # the user chose otherwise, explicitly
    from ray._private import ray_logging

    ray_logging.RAY_DEDUP_LOGS = False


def address_toward(host: str) -> str:
    """This machine's address on the route to ``host`` (no packet is sent: a UDP
    socket's connect only picks the route); a loopback ``host`` is its own answer."""
    if host.startswith("127."):
        return host
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
        except OSError as e:
            raise UserError(f"no route from this machine to the Ray cluster at {host}: "
                            f"{e.strerror or e}") from None
        return str(s.getsockname()[0])


def ensure_ray(address: str | None = None,
               runtime_env: dict[str, Any] | None = None,
               node_ip: str | None = None) -> bool:
    """Start a local Ray on 127.0.0.1 (or join ``address``) unless one is already up.

    ``runtime_env``: the job's, when joining (what :func:`shipped` says travels).
    ``node_ip``: this driver's address on the cluster it joins (``--bind-address``);
    by default the address of this machine on the route to the cluster's head
    (:func:`address_toward`), never 127.0.0.1 for a cluster on other machines: Ray's
    loopback setting (``LOOPBACK_ENV``) would otherwise make the driver 127.0.0.1,
    where the other nodes cannot reach it.

    Returns:
        True if this call started Ray (and so should shut it down).

    Raises:
        UserError: Ray is not installed, or the cluster at ``address`` is unreachable.
    """
    try:
        import ray
    except ImportError:
        raise UserError("the ray engine needs Ray: pip install 'trainthrough[ray]'") from None
    _quiet_injected_deaths()
    if ray.is_initialized():
        # Already connected (a suite's shared session, a library caller's own): an
        # address naming another cluster is refused, not silently ignored.
        if address and address != "auto":
            check_address(address)
            current = ray.get_runtime_context().gcs_address
            if address.split("://", 1)[-1] != current:
                raise UserError(f"this process is already connected to the Ray cluster at "
                                f"{current}; it cannot also join {address}")
        return False
    for k, v in LOOPBACK_ENV.items():
        os.environ.setdefault(k, v)
    _every_line_even_if_imported()
    host = _host(address) if address else "127.0.0.1"
    if host == "127.0.0.1":
        # Also when joining a cluster on 127.0.0.1: Ray would otherwise rewrite it to
        # the external address, where its loopback listeners are not.
        _loopback_even_if_imported()
    term = signal.getsignal(signal.SIGTERM)
    try:
        if address:
            check_address(address)
            # This driver's node address: a cluster of nodes on loopback addresses
            # (127.0.0.2, ...: several nodes on one host) gets its head's address; one on
            # other machines the address that routes there (or --bind-address). A Ray
            # client (ray://) or "auto" picks its own. Every driver of ours on a cluster shares one namespace: actors a driver
            # keeps warm (warm.py) look the next driver's actors up by name.
            ray.init(address=address, log_to_driver=False, configure_logging=False,
                     _node_ip_address=None if address == "auto" or "://" in address
                     else node_ip or address_toward(host),
                     runtime_env=runtime_env, namespace=NAMESPACE)
        else:
            logging.getLogger("ray._private.authentication.authentication_token_setup"
                              ).setLevel(logging.ERROR)
            tmp = tempfile.mkdtemp(prefix="ttray-", dir=_short_temp_root())
            _started_temp.append(tmp)
            # Ray starts its workers at nice 15: beside any other busy process (a test,
            # a data loader, a second job) an actor then gets ~3% of a core, and a rank
            # took over 100 s to import torch beside two busy loops. Our actors are the
            # training itself: they run at the driver's priority (the raylet reads this
            # when ray.init starts it; a user's own setting wins).
            os.environ.setdefault("RAY_worker_niceness", "0")
            ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, _temp_dir=tmp,
                     num_cpus=max(2, os.cpu_count() or 2), log_to_driver=False,
                     configure_logging=False)
        _restore(term)
    except (ConnectionError, RuntimeError, ValueError, TimeoutError) as e:
        _restore(term)
        _remove_temp()
        where = address or "a local cluster"
        text = str(e).strip().splitlines()
        raise UserError(f"could not start or join Ray at {where}: "
                        f"{text[0] if text else type(e).__name__}") from None
    return True


def _injected_death(line: str) -> bool:
    """Whether a message Ray's driver prints is about a worker that died of a failure
    this process injected (known within :data:`_KNOWN_WITHIN`)."""
    m = _DEAD_PID.search(line)
    return m is not None and injected(int(m.group(1)), _KNOWN_WITHIN)


def _quiet_injected_deaths() -> None:
    """Drop Ray's report of the deaths this project injected from the driver's stdout.

    Ray's driver prints every unexpected worker death it hears of ("(raylet) A worker
    died or was killed ... (1) the process was killed by the OOM killer ...") to stdout:
    after every injected SIGKILL, a paragraph that blames memory, 120 of them in one
    advise check. Its printer is looked up by name each time (``listen_error_messages``
    calls the module's ``print_to_stdstream``), so this wraps it, once per process, to
    leave out the lines naming a pid that died of an injected failure (signals.injected);
    every other line passes unchanged (up to :data:`_KNOWN_WITHIN` late: the printer
    runs on Ray's own listener thread). A Ray without that printer is left as it is.
    """
    try:
        from ray._private import worker
    except ImportError:
        return
    printer = getattr(worker, "print_to_stdstream", None)
    if printer is None or getattr(printer, "trainthrough_filtered", False):
        return

    def filtered(data: dict[str, Any], *args: Any, **kwargs: Any) -> None:
        if data.get("pid") == "raylet":
            lines = [x for x in data.get("lines", []) if not _injected_death(str(x))]
            if not lines:
                return
            data = {**data, "lines": lines}
        printer(data, *args, **kwargs)

    filtered.trainthrough_filtered = True  # type: ignore[attr-defined]
    worker.print_to_stdstream = filtered


def _restore(handler: object) -> None:
    """Ray's core installs a native SIGTERM handler that dumps a stack and exits 1;
    put the caller's Python handler back (the CLI's ends the run cleanly, exit 143)."""
    if callable(handler) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)  # type: ignore[arg-type]


def shutdown_ray() -> None:
    """Shut Ray down and remove the session temp dir this module created."""
    import ray

    from trainthrough.engines.ray.driver.pool import POOL

    if ray.is_initialized():
        POOL.detach()  # the cluster's warm pool kills whatever we still lease
    POOL.clear(kill=False)  # its actors end with the session
    if ray.is_initialized():
        ray.shutdown()
    _remove_temp()


def _remove_temp() -> None:
    while _started_temp:  # only folders this module created itself
        shutil.rmtree(_started_temp.pop(), ignore_errors=True)


# What never travels with a user's folder: runs, checkpoints, environments, VCS.
SHIP_EXCLUDES = ["runs/", "checkpoints/", ".venv/", "venv/", ".git/", "__pycache__/",
                 "*.safetensors", "*.pt", "*.ckpt"]


def shipped(reference: str, address: str | None) -> tuple[dict[str, Any] | None, str]:
    """How actors of a cluster we joined get a user's file: Ray's ``working_dir``.

    A ``path/file.py:name`` reference on a joined cluster ships the file's folder (Ray
    uploads it once and unpacks it as each actor's working directory, on every node)
    and the actors import ``file.py:name`` from there: a node that does not share this
    machine's disk runs the same code. Module references and local Ray need nothing.

    Returns:
        The actors' ``runtime_env`` (None: none needed) and the reference they use.
    """
    where, _, name = reference.rpartition(":")
    if not address or not where.endswith(".py"):
        return None, reference
    path = Path(where)
    return ({"working_dir": str(path.parent), "excludes": SHIP_EXCLUDES},
            f"{path.name}:{name}")


def ensure_ray_for(reference: str, address: str | None,
                   node_ip: str | None = None) -> tuple[bool, str]:
    """:func:`ensure_ray` for a run of ``reference``, shipping a user's file to a cluster
    it joins (:func:`shipped`).

    Returns:
        Whether this call started Ray, and the reference the run's actors import.
    """
    env, ref = shipped(reference, address)
    started = ensure_ray(address, runtime_env=env, node_ip=node_ip)
    return started, (ref if env is not None and started else reference)
