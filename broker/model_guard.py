"""Which models the broker serves, so that no chunk runs on a worker of another model.

The first frontend that names its models (its heartbeat's fingerprints: one, or one per model it
serves) sets them. Then a worker whose READY names another fingerprint is refused, a chunk naming
another is refused, and a frontend that names a model outside the set is remembered as foreign: it is
told no worker is live and its chunks are refused.
"""

from __future__ import annotations

# Foreign frontends remembered at most; the set is cleared when full, so identities that come and go
# cannot grow it.
MAX_FOREIGN_FRONTENDS = 1024


class ModelGuard:
    def __init__(self) -> None:
        # fingerprint -> the model's name, as the first frontend named it
        self.models: dict[str, str] = {}
        self.foreign_frontends: set[bytes] = set()

    def frontend_expects(self, frontend: bytes, models: dict[str, str]) -> str:
        """Note the models (fingerprint -> name) a frontend's heartbeat names. Returns 'set' when this
        fixed the broker's models, 'foreign' when the frontend expects another, '' otherwise."""
        if not models:
            return ""
        if not self.models:
            self.models = dict(models)
            return "set"
        if not models.keys() <= self.models.keys():
            if len(self.foreign_frontends) >= MAX_FOREIGN_FRONTENDS:
                self.foreign_frontends.clear()
            self.foreign_frontends.add(frontend)
            return "foreign"
        self.foreign_frontends.discard(frontend)
        return ""

    def admits(self, fingerprint: str) -> bool:
        """Whether a worker or a chunk of this fingerprint may be served (any may, until a frontend names
        its models; a chunk naming none goes to the models there are)."""
        return not self.models or fingerprint in self.models

    def is_foreign(self, frontend: bytes) -> bool:
        return frontend in self.foreign_frontends

    def name(self, fingerprint: str) -> str:
        """The model's name as frontends gave it, else its fingerprint."""
        return self.models.get(fingerprint) or f"fingerprint {fingerprint}"

    def served(self) -> str:
        return ", ".join(f"{name} (fingerprint {fp})" for fp, name in self.models.items())

    def refusal(self, model: str, fingerprint: str) -> str:
        """Why a worker serving `model` is refused, naming the models served."""
        return (f"this worker serves {model} (fingerprint {fingerprint or 'none'}); the broker's frontends "
                f"expect {self.served()}")
