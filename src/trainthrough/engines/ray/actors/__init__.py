"""What runs inside the ``ray`` engine's actor processes.

:mod:`.shard_actor`: a parameter-server shard (one replica of its chain), with its
checkpoint writes (:mod:`.persister`); :mod:`.worker_actor`: a worker running at its
own pace or in bulk-synchronous rounds. Every actor answers ``whoami`` (pid, node),
keeps a ``watch`` call pending that fails only when its process dies, and can be
``release``d after a run and ``reset`` for the next one exactly as a new actor would
start. Ray creates these classes by import path: they must stay importable from here.
Importing this package imports nothing.
"""
