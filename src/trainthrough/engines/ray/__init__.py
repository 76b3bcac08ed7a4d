"""The ``ray`` engine: shards, replicas and workers as Ray actors, failures as SIGKILL.

Ray reads some settings when it is imported, so the loopback settings go into the
environment here, before any submodule imports ray (see runtime.py for why).
"""

import os

for _k, _v in {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0",
               "RAY_DEDUP_LOGS": "0"}.items():
    os.environ.setdefault(_k, _v)
