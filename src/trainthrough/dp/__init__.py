"""Data-parallel training logic shared by every engine: ranks, batching, allreduce."""
