"""The ``ray`` engine: shards, replicas and workers as Ray actors, failures as SIGKILL."""
