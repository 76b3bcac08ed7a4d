"""Whether a test can have a real ZooKeeper server: skipped locally, failed under CI."""

from __future__ import annotations

import importlib.util
import os

import pytest

from trainthrough.coord.zkserver import find_zookeeper


def require_zookeeper(what: str) -> None:
    """Skip (locally) or fail (under CI, where ``.ci/run`` installs both) when the
    ZooKeeper server or kazoo is missing; ``what`` names who needs it."""
    missing = None
    if find_zookeeper() is None:
        missing = "no ZooKeeper server installed (Debian package `zookeeper`, needs java)"
    elif importlib.util.find_spec("kazoo") is None:
        missing = "kazoo is not installed (extra `zookeeper`)"
    if missing:
        msg = f"{what} needs {missing}; .ci/run installs it (see .ci/run and the Makefile)"
        if os.environ.get("CI"):
            pytest.fail(msg, pytrace=False)
        pytest.skip(msg)
