"""ZeroMQ sockets set up the same way in every process, and sending/receiving protocol messages."""

from __future__ import annotations

from typing import Any

import zmq

from quiver.common.protocol import MAX_FRAME_BYTES, Message, Routed, decode, peek, split_identity

HIGH_WATER_MARK = 100_000


def make_socket(ctx: zmq.Context, kind: int, identity: bytes | None = None, handover: bool = False) -> zmq.Socket:
    """A socket that never blocks close (LINGER 0), queues generously before dropping, and disconnects
    a peer that sends a frame larger than any message of the protocol carries (so it is never
    buffered whole). A ROUTER refuses a second peer presenting an identity already connected, unless
    `handover`: then the newcomer takes that identity's route (safe only where identities are secret)."""
    sock = ctx.socket(kind)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, HIGH_WATER_MARK)
    sock.setsockopt(zmq.RCVHWM, HIGH_WATER_MARK)
    sock.setsockopt(zmq.MAXMSGSIZE, MAX_FRAME_BYTES)
    if identity is not None:
        sock.setsockopt(zmq.ROUTING_ID, identity)
    if kind == zmq.ROUTER and handover:
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


def recv_peeked(sock: zmq.Socket, flags: int = zmq.NOBLOCK) -> tuple[bytes, Message | Routed]:
    """Receive on the broker's ROUTERs: (peer identity, message), CHUNK and RESULT left undecoded
    (see protocol.peek). Raises ProtocolError on bad input, zmq.Again when nothing is waiting."""
    identity, frames = split_identity(sock.recv_multipart(flags, copy=False))
    return identity, peek(frames)


def recv(sock: zmq.Socket, flags: int = zmq.NOBLOCK) -> Message:
    """Receive on a DEALER. Raises ProtocolError on bad input, zmq.Again when nothing is waiting."""
    return decode(sock.recv_multipart(flags, copy=False))
