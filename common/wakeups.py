"""Busy polling that wakes nobody: a spinning thread keeps its ZeroMQ I/O threads on its own CPU.

A message between two processes passes through libzmq's I/O thread in each: the sender's writes the
socket, the receiver's reads it and signals the polling thread. Between messages those threads sleep,
and the kernel wakes a thread on an idle CPU when one is free; on a virtual machine an idle CPU has
halted, and the wake-up waits for the hypervisor to run that CPU again (`python -m quiver.bench.wakeup`
measures both on the host it runs on). Busy polling keeps the polling thread's CPU running, but not the
CPUs its I/O threads wake on.

So while a process busy-polls, a SpinCore pins the context's I/O threads to the CPU the polling thread is
on, and the spin yields at every turn (`spin_turn`): a woken I/O thread finds a running CPU and runs at the
spin's next turn. When the window closes, `release` gives them back every CPU the process may use, so an
idle process pins nothing.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from typing import Callable

import zmq

log = logging.getLogger("quiver.wakeups")

_TASKS = "/proc/self/task"


def _tasks() -> set[int]:
    return {int(tid) for tid in os.listdir(_TASKS)}


def zmq_io_threads(ctx: zmq.Context) -> set[int]:
    """Native ids of the threads libzmq starts for `ctx` (its I/O threads and reaper), found by starting
    them: call before the context's first socket (afterwards it finds none). Python's threads are left out."""
    if not os.path.isdir(_TASKS):
        return set()
    before = _tasks()
    ctx.socket(zmq.PAIR).close()
    return _tasks() - before - {thread.native_id for thread in threading.enumerate()}


def _current_cpu_reader() -> Callable[[], int] | None:
    try:
        function = ctypes.CDLL(None, use_errno=True).sched_getcpu
    except (OSError, AttributeError):
        return None
    function.restype = ctypes.c_int
    function.argtypes = []
    return function


_sched_getcpu = _current_cpu_reader()


def current_cpu() -> int | None:
    """The CPU the calling thread runs on (glibc's sched_getcpu), None where that cannot be read."""
    cpu = _sched_getcpu() if _sched_getcpu is not None else -1
    return cpu if cpu >= 0 else None


class SpinCore:
    """The CPU a busy-polling thread shares with its context's I/O threads while it spins (module docstring).

    Made before the context's first socket; with `enabled` False, or where the I/O threads or the current
    CPU cannot be found, or the process may use a single CPU, it does nothing. Only the I/O threads are
    pinned: they follow the polling thread, which is left free (a thread inherits its creator's CPUs, and
    the threads a poller starts, a frontend's tokenizing pool say, must keep every CPU)."""

    def __init__(self, ctx: zmq.Context, enabled: bool = True) -> None:
        self.allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        usable = enabled and len(self.allowed) > 1 and _sched_getcpu is not None
        self.io_threads = zmq_io_threads(ctx) if usable else set()
        self.cpu: int | None = None  # while held: where the I/O threads are

    @property
    def held(self) -> bool:
        return self.cpu is not None

    def hold(self) -> None:
        """Put the I/O threads on the CPU the caller runs on (if not held already)."""
        if self.cpu is None and self.io_threads:
            self._pin(current_cpu())

    def spin_turn(self) -> None:
        """One empty turn of a spin: while held, give the CPU to a woken I/O thread, if any, and move the
        I/O threads after the caller if the kernel has moved it."""
        if self.cpu is not None:
            os.sched_yield()
            cpu = current_cpu()
            if cpu != self.cpu:
                self._pin(cpu)

    def release(self) -> None:
        """Let the I/O threads run on any CPU the process may use again."""
        if self.cpu is not None:
            for tid in self.io_threads:
                _set_affinity(tid, self.allowed)
            self.cpu = None

    def _pin(self, cpu: int | None) -> None:
        if cpu is None or cpu not in self.allowed:
            self.release()
            return
        for tid in self.io_threads:
            _set_affinity(tid, {cpu})
        self.cpu = cpu


def _set_affinity(tid: int, cpus: set[int]) -> None:
    try:
        os.sched_setaffinity(tid, cpus)
    except OSError as exc:  # the thread is gone, or a policy forbids it: then it stays where it is
        log.debug("could not set the CPUs of thread %d: %s", tid, exc)
