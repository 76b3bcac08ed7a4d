"""Crash-consistent checkpoint storage (safetensors + manifest, local or fsspec)."""

from trainthrough.errors import CheckpointCorrupt
from trainthrough.ft.checkpoint.store import FORMAT, CheckpointInfo, CheckpointStore

__all__ = ["FORMAT", "CheckpointCorrupt", "CheckpointInfo", "CheckpointStore"]
