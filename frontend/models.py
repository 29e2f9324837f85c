"""The frontend's model registry: one Service per served model, found by any of its names.

Each model has its own tokenizer, templates, limits and pipeline (whose chunks name the model's
fingerprint, so the broker runs them only on that model's workers); all share the broker link and the
frontend's in-flight budget. A request's `model` picks the service. With one model any name is
answered by it (as Text Embeddings Inference does; --strict-model-name refuses others in
Service.check_model); with several, a name none of them answers to is 404 listing the served names,
and a request naming no model goes to the first.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from quiver.common.config import FrontendSettings
from quiver.common.fingerprint import model_fingerprint
from quiver.common.model_info import default_model_dir, load_model_info, resolve_model_dir
from quiver.common.security import CurveClient
from quiver.common.models_file import ModelEntry, check_unique_names, load_models_file
from quiver.frontend.admission import Admission
from quiver.frontend.broker_client import BrokerClient
from quiver.frontend.errors import APIError
from quiver.frontend.service import Service


class ModelRegistry:
    def __init__(self, services: list[Service]) -> None:
        self.services = services
        self.default = services[0]
        self.by_name: dict[str, Service] = {}
        for service in services:
            for name in (*service.model_names, service.info.path.name):
                self.by_name.setdefault(name, service)

    def names(self) -> list[str]:
        """Every served model's names, model by model."""
        return [name for service in self.services for name in service.model_names]

    def pick(self, model: str | None) -> Service:
        """The service a request's `model` names (the first when it names none)."""
        if len(self.services) == 1 or not model:
            return self.default
        service = self.by_name.get(model)
        if service is None:
            served = ", ".join(repr(name) for name in self.names())
            raise APIError("not_found", f"the model {model!r} does not exist; this server serves {served}",
                           param="model")
        return service


def model_entries(settings: FrontendSettings) -> list[ModelEntry]:
    """The models to serve: --models-file's, else --model's (the packaged MiniLM by default)."""
    if settings.models_file:
        return load_models_file(settings.models_file).models
    entries = [ModelEntry(settings.model or str(default_model_dir()), settings.served_model_name)]
    check_unique_names(entries)
    return entries


def build_registry(settings: FrontendSettings, curve: CurveClient | None) -> tuple[ModelRegistry, BrokerClient]:
    """Load every model (tokenizer, templates, limits) and one broker link that names them all."""
    loaded = []
    for entry in model_entries(settings):
        directory = Path(resolve_model_dir(entry.model))
        names = entry.names()
        info = load_model_info(directory, name=names[0] if names else None)
        loaded.append((dataclasses.replace(settings, model=str(directory), served_model_name=entry.served_model_name),
                       info, model_fingerprint(directory)))
    _, first_info, first_fingerprint = loaded[0]
    client = BrokerClient(settings.broker, settings.heartbeat_interval_s, settings.liveness, curve=curve,
                          fingerprint=first_fingerprint, model=first_info.name,
                          models={fp: info.name for _, info, fp in loaded} if len(loaded) > 1 else None,
                          busy_poll_us=settings.busy_poll_us, busy_poll_pin=settings.busy_poll_pin)
    admission = Admission(settings.max_inflight_tokens)
    services = [Service(model_settings, info, client, admission=admission, fingerprint=fingerprint)
                for model_settings, info, fingerprint in loaded]
    return ModelRegistry(services), client
