"""ZeroMQ sockets set up the same way in every process, and sending/receiving protocol messages."""

from __future__ import annotations

from typing import Any

import zmq

from quiver.common.protocol import Message, decode, split_identity

HIGH_WATER_MARK = 100_000


def make_socket(ctx: zmq.Context, kind: int, identity: bytes | None = None) -> zmq.Socket:
    """A socket that never blocks close (LINGER 0) and queues generously before dropping."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, HIGH_WATER_MARK)
    sock.setsockopt(zmq.RCVHWM, HIGH_WATER_MARK)
    if identity is not None:
        sock.setsockopt(zmq.ROUTING_ID, identity)
    if kind == zmq.ROUTER:
        # A peer that reconnects under the same identity takes over its old connection.
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
    if kind in (zmq.DEALER, zmq.ROUTER):
        sock.setsockopt(zmq.RECONNECT_IVL, 100)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
    return sock


def send(sock: zmq.Socket, message: Message, identity: bytes | None = None) -> None:
    frames: list[Any] = message.encode()
    if identity is not None:
        frames = [identity, *frames]
    sock.send_multipart(frames, copy=False)


def send_frames(sock: zmq.Socket, frames: list[Any], identity: bytes | None = None) -> None:
    """Forward already-encoded frames, optionally routed to `identity`."""
    sock.send_multipart([identity, *frames] if identity is not None else frames, copy=False)


def recv_routed(sock: zmq.Socket, flags: int = zmq.NOBLOCK) -> tuple[bytes, Message]:
    """Receive on a ROUTER: (peer identity, decoded message). Raises ProtocolError on bad input,
    zmq.Again when nothing is waiting."""
    identity, frames = split_identity(sock.recv_multipart(flags, copy=False))
    return identity, decode(frames)


def recv(sock: zmq.Socket, flags: int = zmq.NOBLOCK) -> Message:
    """Receive on a DEALER. Raises ProtocolError on bad input, zmq.Again when nothing is waiting."""
    return decode(sock.recv_multipart(flags, copy=False))
