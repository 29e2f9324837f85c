"""SpinCore: while held, its ZeroMQ context's I/O threads are pinned to the CPU the polling thread is on
(the poller itself stays free); released, they may run on every CPU of the process again."""

from __future__ import annotations

import os
import threading

import pytest
import zmq

from quiver.common.transport import make_socket
from quiver.common.wakeups import SpinCore, zmq_io_threads

needs_two_cpus = pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="pinning needs two CPUs")


def _cpus_of(tid: int) -> set[int]:
    return os.sched_getaffinity(tid)


def test_the_io_threads_are_found_by_starting_them_and_only_before_the_first_socket() -> None:
    ctx = zmq.Context()
    try:
        threads = zmq_io_threads(ctx)
        assert threads, "libzmq starts at least its I/O thread and reaper"
        assert threading.get_native_id() not in threads
        assert all(os.path.isdir(f"/proc/self/task/{tid}") for tid in threads)
        assert zmq_io_threads(ctx) == set()  # already started: nothing new to find
    finally:
        ctx.term()


@needs_two_cpus
def test_holding_pins_the_io_threads_to_the_pollers_cpu_and_release_restores_them() -> None:
    allowed = os.sched_getaffinity(0)
    ctx = zmq.Context()
    core = SpinCore(ctx)
    a, b = make_socket(ctx, zmq.PAIR), make_socket(ctx, zmq.PAIR)
    try:
        b.bind("inproc://spin-core-test")
        a.connect("inproc://spin-core-test")
        core.hold()
        assert core.held and core.cpu is not None
        me = threading.get_native_id()
        assert _cpus_of(me) == allowed  # threads the poller starts must not inherit a pin
        assert all(_cpus_of(tid) == {core.cpu} for tid in core.io_threads)
        os.sched_setaffinity(me, {core.cpu})
        held_on = core.cpu
        core.hold()  # held already: stays where it is
        assert core.cpu == held_on
        other = next(cpu for cpu in allowed if cpu != held_on)
        os.sched_setaffinity(me, {other})  # the kernel moves the poller: the I/O threads follow at its next turn
        core.spin_turn()
        assert core.cpu == other and all(_cpus_of(tid) == {other} for tid in core.io_threads)
        os.sched_setaffinity(me, allowed)
        a.send(b"ping")  # messages flow while held
        assert b.poll(5000) and b.recv() == b"ping"
        core.release()
        assert not core.held
        assert _cpus_of(me) == allowed
        assert all(_cpus_of(tid) == allowed for tid in core.io_threads)
        core.release()  # released already: nothing to do
    finally:
        core.release()
        a.close()
        b.close()
        ctx.term()


def test_a_disabled_core_pins_nothing() -> None:
    allowed = os.sched_getaffinity(0)
    ctx = zmq.Context()
    try:
        core = SpinCore(ctx, enabled=False)
        core.hold()
        assert not core.held and core.io_threads == set()
        assert os.sched_getaffinity(threading.get_native_id()) == allowed
    finally:
        ctx.term()


def test_a_context_started_before_the_core_pins_nothing() -> None:
    ctx = zmq.Context()
    sock = make_socket(ctx, zmq.DEALER)
    try:
        core = SpinCore(ctx)
        core.hold()
        assert not core.held
    finally:
        sock.close()
        ctx.term()
