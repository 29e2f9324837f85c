"""Which model the broker serves, so that no chunk runs on a worker of another model.

One model per broker: the first frontend that names one (its heartbeat's fingerprint) sets it. Then
a worker whose READY names another fingerprint is refused, and a frontend that names another is
remembered as foreign: it is told no worker is live and its chunks are refused.
"""

from __future__ import annotations

# Foreign frontends remembered at most; the set is cleared when full, so identities that come and go
# cannot grow it.
MAX_FOREIGN_FRONTENDS = 1024


class ModelGuard:
    def __init__(self) -> None:
        self.fingerprint = ""
        self.model = ""
        self.foreign_frontends: set[bytes] = set()

    def frontend_expects(self, frontend: bytes, fingerprint: str, model: str) -> str:
        """Note what a frontend's heartbeat names. Returns 'set' when this fixed the broker's model,
        'foreign' when the frontend expects another, '' otherwise."""
        if not fingerprint:
            return ""
        if not self.fingerprint:
            self.fingerprint, self.model = fingerprint, model
            return "set"
        if fingerprint != self.fingerprint:
            if len(self.foreign_frontends) >= MAX_FOREIGN_FRONTENDS:
                self.foreign_frontends.clear()
            self.foreign_frontends.add(frontend)
            return "foreign"
        self.foreign_frontends.discard(frontend)
        return ""

    def admits(self, fingerprint: str) -> bool:
        """Whether a worker of this fingerprint may serve (any may, until a frontend names a model)."""
        return not self.fingerprint or fingerprint == self.fingerprint

    def is_foreign(self, frontend: bytes) -> bool:
        return frontend in self.foreign_frontends

    def refusal(self, model: str, fingerprint: str) -> str:
        """Why a worker serving `model` is refused, naming both models."""
        return (f"this worker serves {model} (fingerprint {fingerprint or 'none'}); the broker's frontends "
                f"expect {self.model} (fingerprint {self.fingerprint})")
