"""The driver process's side of the ``ray`` engine.

:mod:`.engine` runs a parameter-server configuration: it starts the run's actors
(:mod:`.cluster`, each one a :class:`~.members.Member` with an explicit life cycle),
injects failures, watches for deaths and measures what follows. What it does about a
death is :mod:`.recovery`; bulk-synchronous rounds are :mod:`.bsp`; when to save is the
shared checkpointer, driven through :mod:`.checkpoints`. Those helpers use the engine
only through :class:`~.interface.Driver`.

Actors are reused between runs (:mod:`.pool`, within one driver; :mod:`.warm`, kept
on a cluster between drivers). Data parallel on Ray (:mod:`.dp`) is the gloo engine's
controller with every rank a process of its node's host actor. Importing this package imports nothing.
"""
