"""Starting and joining Ray, on loopback unless the user asks otherwise.

ENVIRONMENT.md measured that Ray advertises the machine's external address even with
``_node_ip_address="127.0.0.1"``, and that ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``
made every listener bind to 127.0.0.1; usage stats are off. Ray's session files go
under a short temp dir (Unix socket paths are limited to ~107 bytes, so the run
folder itself is often too deep), which the run folder records.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from trainthrough.errors import UserError

_LOOPBACK_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
                 "RAY_DEDUP_LOGS": "0"}


def ensure_ray(address: str | None = None, temp_root: Path | None = None) -> bool:
    """Start a local Ray (or join ``address``) unless one is already up.

    Returns:
        True if this call started Ray (and so should shut it down).

    Raises:
        UserError: Ray is not installed, or the cluster at ``address`` is unreachable.
    """
    try:
        import ray
    except ImportError:
        raise UserError("the ray engine needs Ray: pip install 'trainthrough[ray]'") from None
    if ray.is_initialized():
        return False
    for k, v in _LOOPBACK_ENV.items():
        os.environ.setdefault(k, v)
    try:
        if address:
            ray.init(address=address, log_to_driver=False, configure_logging=False)
        else:
            base = temp_root if temp_root and len(str(temp_root)) < 40 else None
            tmp = tempfile.mkdtemp(prefix="ttray-", dir=base)
            ray.init(_node_ip_address="127.0.0.1", include_dashboard=False, _temp_dir=tmp,
                     num_cpus=max(2, os.cpu_count() or 2), log_to_driver=False,
                     configure_logging=False)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = address or "a local cluster"
        raise UserError(f"could not start or join Ray at {where}: "
                        f"{str(e).splitlines()[0]}") from None
    return True


def shutdown_ray() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
