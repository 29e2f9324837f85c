"""Keep a worker's host memory flat.

Batches of ever-changing shapes make the C allocator (glibc malloc) keep freed blocks around, spread
over one arena per thread: a CPU worker's resident memory then creeps up by hundreds of MiB over
minutes although nothing leaks. Two arenas are enough for a worker (the scheduler and the I/O
thread), and `malloc_trim(0)` returns free blocks; the scheduler calls it every so many steps and
when it goes idle. Where the C library lacks these calls (musl, macOS), this does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

TRIM_EVERY_STEPS = 64


M_ARENA_MAX = -8  # mallopt's parameter number, from glibc's malloc.h
WORKER_ARENAS = 2


def _libc_function(name: str):
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


_malloc_trim = _libc_function("malloc_trim")
_mallopt = _libc_function("mallopt")


def limit_arenas() -> None:
    """Call once, early: later threads share WORKER_ARENAS arenas instead of getting one each."""
    if _mallopt is not None:
        _mallopt(M_ARENA_MAX, WORKER_ARENAS)


def release_free_memory() -> None:
    if _malloc_trim is not None:
        _malloc_trim(0)
