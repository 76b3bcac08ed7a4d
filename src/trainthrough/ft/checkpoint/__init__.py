"""Crash-consistent checkpoint storage (safetensors + manifest, local or fsspec)."""

from trainthrough.errors import CheckpointCorrupt
from trainthrough.ft.checkpoint.location import absolute_base, new_run_id, run_location, run_of
from trainthrough.ft.checkpoint.manifest import FORMAT
from trainthrough.ft.checkpoint.store import CheckpointInfo, CheckpointStore, require_ints

__all__ = ["FORMAT", "CheckpointCorrupt", "CheckpointInfo", "CheckpointStore", "absolute_base",
           "new_run_id", "require_ints", "run_location", "run_of"]
