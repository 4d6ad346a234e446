"""Preloads for test zygotes (``Preload`` targets): imported by the zygote alone, so nothing here imports Django."""


def torch_with_every_call_traced():
    """torch with its thread setter wrapped as TrainCheck's instrumentation wraps it: a call before the program has
    named its trace folder (``TRAINCHECK_OUTPUT_DIR``) fails, as TrainCheck's tracer does."""
    import os

    import torch

    def traced(function):
        def wrapper(*args, **kwargs):
            assert os.environ.get("TRAINCHECK_OUTPUT_DIR"), "traced before the program named its trace folder"
            return function(*args, **kwargs)
        return wrapper

    torch.set_num_threads = traced(torch.set_num_threads)
    torch._C.set_num_threads = traced(torch._C.set_num_threads)


class _Flushed:
    """What a preload keeps for the process's life (a buffer, say), flushed by a finalizer at exit."""


_kept = None


def torch_with_a_flush_at_exit():
    """torch, and a finalizer of the preload's own that says so at exit (not torch's: it must still run in a run)."""
    import weakref

    import torch  # noqa: F401

    global _kept
    _kept = _Flushed()
    weakref.finalize(_kept, print, "the preload's finalizer ran")
