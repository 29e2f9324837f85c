"""CurveZMQ for links between hosts: key pairs, a server that admits only authorized keys, clients.

`quiver keys` writes a key pair as ZeroMQ certificate files: NAME.key (public, safe to copy to peers)
and NAME.key_secret (secret and public, mode 0600). The broker serves with its secret key and admits
a frontend only if its public key file is in the frontend keys directory, a worker only if its key is
in the worker keys directory (each ROUTER socket authenticates in its own ZAP domain, so a key is
bound to a role); peers connect with their own secret key and the broker's public key. Without keys,
sockets stay on loopback: binding any other address without CurveZMQ is refused.

On any transport, a broker given a cluster secret (QUIVER_CLUSTER_SECRET, or a file) registers only
workers whose READY carries it; `quiver serve` makes one per run and hands it to its children through
the environment, never on a command line.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

log = logging.getLogger("quiver.security")


class SecurityError(ValueError):
    """A key file is missing or unreadable, or an endpoint would be exposed without encryption."""


def make_keys(directory: str | Path, name: str) -> tuple[Path, Path]:
    """Write NAME.key and NAME.key_secret into `directory`; return their paths."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    public, secret = zmq.auth.create_certificates(directory, name)
    os.chmod(secret, 0o600)
    return Path(public), Path(secret)


def _load(path: str, need_secret: bool) -> tuple[bytes, bytes | None]:
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise SecurityError(f"cannot read the key file {path}: {exc}") from exc
    if need_secret and secret is None:
        raise SecurityError(f"{path} holds no secret key (use the .key_secret file)")
    return public, secret


def is_loopback(endpoint: str) -> bool:
    """Whether a ZeroMQ endpoint stays on this host (ipc://, inproc://, or TCP on a loopback address)."""
    if not endpoint.startswith("tcp://"):
        return True
    host = endpoint[len("tcp://"):].rsplit(":", 1)[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name or '*': reachable from elsewhere


CLUSTER_SECRET_ENV = "QUIVER_CLUSTER_SECRET"
FRONTEND_DOMAIN = "frontend"
WORKER_DOMAIN = "worker"


def new_cluster_secret() -> str:
    return secrets.token_hex(32)


def cluster_secret(secret_file: str = "") -> str:
    """The cluster secret from `secret_file` when given, else from QUIVER_CLUSTER_SECRET, else ''."""
    if secret_file:
        try:
            return Path(secret_file).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise SecurityError(f"cannot read the cluster secret file {secret_file}: {exc}") from exc
    return os.environ.get(CLUSTER_SECRET_ENV, "").strip()


def secret_matches(expected: str, given: str) -> bool:
    """Constant-time comparison; an empty expected secret admits anyone."""
    return not expected or hmac.compare_digest(expected.encode(), given.encode())


@dataclass
class CurveServer:
    """The broker's side: its key pair and, per role, the directory of public keys it admits."""

    secret_key_file: str
    frontend_keys_dir: str
    worker_keys_dir: str

    def start(self, ctx: zmq.Context) -> ThreadAuthenticator:
        for directory in (self.frontend_keys_dir, self.worker_keys_dir):
            if not Path(directory).is_dir():
                raise SecurityError(f"the authorized keys directory {directory} does not exist")
        auth = ThreadAuthenticator(ctx)
        auth.start()
        auth.configure_curve(domain=FRONTEND_DOMAIN, location=self.frontend_keys_dir)
        auth.configure_curve(domain=WORKER_DOMAIN, location=self.worker_keys_dir)
        return auth

    def apply(self, sock: zmq.Socket, domain: str) -> None:
        """Serve Curve on `sock`, admitting only the keys of `domain`'s directory."""
        public, secret = _load(self.secret_key_file, need_secret=True)
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        sock.curve_server = True
        sock.zap_domain = domain.encode()


def server_from(secret_key_file: str, frontend_keys_dir: str, worker_keys_dir: str,
                authorized_dir: str) -> CurveServer | None:
    """The broker's Curve settings, or None without a secret key. `authorized_dir` stands in for a
    role directory not given (it admits its keys in both roles, with a warning)."""
    if not secret_key_file:
        if frontend_keys_dir or worker_keys_dir or authorized_dir:
            raise SecurityError("authorized key directories need --curve-secret-key")
        return None
    if not (frontend_keys_dir and worker_keys_dir):
        if not authorized_dir:
            raise SecurityError("CurveZMQ needs --curve-frontend-keys-dir and --curve-worker-keys-dir")
        log.warning("--curve-authorized-dir admits its keys as frontends and as workers alike; give "
                    "--curve-frontend-keys-dir and --curve-worker-keys-dir to bind each key to its role")
    return CurveServer(secret_key_file, frontend_keys_dir or authorized_dir, worker_keys_dir or authorized_dir)


@dataclass
class CurveClient:
    """A frontend's or worker's side: its own key pair and the broker's public key."""

    secret_key_file: str
    broker_key_file: str

    def apply(self, sock: zmq.Socket) -> None:
        public, secret = _load(self.secret_key_file, need_secret=True)
        server_public, _ = _load(self.broker_key_file, need_secret=False)
        sock.curve_publickey = public
        sock.curve_secretkey = secret
        sock.curve_serverkey = server_public


def client_from(secret_key_file: str, broker_key_file: str) -> CurveClient | None:
    """Curve settings of a peer, or None when it uses none (then it must connect over loopback)."""
    if bool(secret_key_file) != bool(broker_key_file):
        raise SecurityError("CurveZMQ needs both --curve-secret-key and --curve-broker-key")
    return CurveClient(secret_key_file, broker_key_file) if secret_key_file else None


def check_exposure(endpoints: list[str], curve: object | None, allow_insecure: bool) -> None:
    """Refuse to bind a non-loopback endpoint without CurveZMQ, unless explicitly allowed."""
    exposed = [e for e in endpoints if not is_loopback(e)]
    if exposed and curve is None and not allow_insecure:
        raise SecurityError(f"{', '.join(exposed)} can be reached from other hosts; give CurveZMQ keys "
                            f"(--curve-secret-key and the per-role key directories) or pass --allow-insecure")
    if exposed and curve is None:
        log.warning("binding %s without encryption or authentication (--allow-insecure)", ", ".join(exposed))
