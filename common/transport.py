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


# pyzmq's send_multipart and recv_multipart combine flags and read RCVMORE as enum members, a few
# microseconds per frame; the broker's per-message cost is a few dozen. Plain ints and Frame.more here.
_SNDMORE = int(zmq.SNDMORE)
_NOBLOCK = int(zmq.NOBLOCK)
# zmq.Socket.send is a Python wrapper over the compiled send that only adds the draft API's routing_id
# and group; a plain socket is sent on through the compiled one directly (a fifth of a send's cost).
# Sockets whose class overrides send (zmq.asyncio's) keep their own.
_PLAIN_SEND = zmq.Socket.send
_COMPILED_SEND = zmq.backend.Socket.send


def send(sock: zmq.Socket, message: Message, identity: bytes | None = None) -> None:
    send_frames(sock, message.encode(), identity)


def send_frames(sock: zmq.Socket, frames: list[Any], identity: bytes | None = None, flags: int = 0) -> None:
    """Send already-encoded frames (bytes, buffers or received Frames, not copied), optionally routed to
    `identity`. With NOBLOCK a full queue raises zmq.Again at the first frame, before any is queued."""
    more = _SNDMORE | flags
    if type(sock).send is not _PLAIN_SEND:
        send_one = sock.send
        if identity is not None:
            send_one(identity, more)
        for frame in frames[:-1]:
            send_one(frame, more, copy=False)
        send_one(frames[-1], flags, copy=False)
        return
    if identity is not None:
        _COMPILED_SEND(sock, identity, more)
    for frame in frames[:-1]:
        _COMPILED_SEND(sock, frame, more, False)
    _COMPILED_SEND(sock, frames[-1], flags, False)


def recv_frames(sock: zmq.Socket, flags: int = _NOBLOCK) -> list[zmq.Frame]:
    """Every frame of the next message, not copied. Raises zmq.Again when nothing is waiting."""
    frame = sock.recv(flags, copy=False)
    frames = [frame]
    while frame.more:
        frame = sock.recv(flags, copy=False)
        frames.append(frame)
    return frames


def recv_peeked(sock: zmq.Socket, flags: int = _NOBLOCK) -> tuple[bytes, Message | Routed]:
    """Receive on the broker's ROUTERs: (peer identity, message), CHUNK and RESULT left undecoded
    (see protocol.peek). Raises ProtocolError on bad input, zmq.Again when nothing is waiting."""
    identity, frames = split_identity(recv_frames(sock, flags))
    return identity, peek(frames)


def recv(sock: zmq.Socket, flags: int = _NOBLOCK) -> Message:
    """Receive on a DEALER. Raises ProtocolError on bad input, zmq.Again when nothing is waiting."""
    return decode(recv_frames(sock, flags))
