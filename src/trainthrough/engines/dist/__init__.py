"""The ``dist`` engine: data-parallel ranks as OS processes on a torch.distributed
gloo group (127.0.0.1), started and supervised by a controller that owns the store."""
