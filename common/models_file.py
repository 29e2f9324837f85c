"""The models one server runs, as a TOML file: `quiver serve --config FILE` and `quiver frontend
--models-file FILE` read the same file.

    [serve]                      # optional: any `quiver serve` option, by its field name
    port = 8080

    [[models]]                   # one table per model; the first is the default
    model = "/models/minilm"     # checkpoint directory or hub id (required)
    served_model_name = "minilm,embedder"   # the names requests may use, the first in responses
    device = "cuda:0"            # cpu, cuda, cuda:N or cuda:N,M: one worker per GPU named
    gpu_memory_fraction = 0.4    # several models on one GPU: each worker's share of its memory
    dtype = "bfloat16"
    max_batch_tokens = 16384

A frontend reads `model` and `served_model_name`; `quiver serve` also the worker options.
"""

from __future__ import annotations

import json
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, get_type_hints

from quiver.common.model_info import ModelError


class ModelsFileError(ModelError):
    """The file cannot be read or does not follow the format above."""


@dataclass
class ModelEntry:
    """One model and the options of its workers (0 or '': serve's own value)."""

    model: str
    served_model_name: str = ""
    device: str = ""
    workers: int = 0
    gpu_memory_fraction: float = 0.0
    dtype: str = ""
    max_batch_tokens: int = 0
    max_batch_seqs: int = 0

    def names(self) -> list[str]:
        return [name.strip() for name in self.served_model_name.split(",") if name.strip()]


@dataclass
class ModelsFile:
    serve: dict[str, Any]
    models: list[ModelEntry]


def _entry(index: int, table: Any) -> ModelEntry:
    where = f"[[models]] table {index + 1}"
    if not isinstance(table, dict):
        raise ModelsFileError(f"{where} is not a table")
    hints = get_type_hints(ModelEntry)
    known = {f.name for f in fields(ModelEntry)}
    unknown = sorted(set(table) - known)
    if unknown:
        raise ModelsFileError(f"{where}: unknown keys {unknown}; known: {sorted(known)}")
    if not isinstance(table.get("model"), str) or not table["model"]:
        raise ModelsFileError(f"{where} needs model = \"<directory or hub id>\"")
    for key, value in table.items():
        kind = hints[key]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = table[key] = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ModelsFileError(f"{where}: {key} must be of type {kind.__name__}, not {value!r}")
    if not 0.0 <= table.get("gpu_memory_fraction", 0.0) <= 1.0:
        raise ModelsFileError(f"{where}: gpu_memory_fraction must lie in [0, 1]")
    return ModelEntry(**table)


def load_models_file(path: str | Path) -> ModelsFile:
    """The file's [serve] options and [[models]] tables, checked; ModelsFileError says what is wrong."""
    try:
        document = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise ModelsFileError(f"cannot read {path}: {exc}") from exc
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ModelsFileError(f"{path} is not TOML: {exc}") from exc
    unknown = sorted(set(document) - {"serve", "models"})
    if unknown:
        raise ModelsFileError(f"{path}: unknown top-level keys {unknown}; use [serve] and [[models]]")
    serve = document.get("serve", {})
    if not isinstance(serve, dict):
        raise ModelsFileError(f"{path}: [serve] must be a table")
    tables = document.get("models", [])
    if not isinstance(tables, list) or not tables:
        raise ModelsFileError(f"{path} names no model: add a [[models]] table with model = \"...\"")
    models = [_entry(index, table) for index, table in enumerate(tables)]
    check_unique_names(models)
    return ModelsFile(serve, models)


def check_unique_names(models: list[ModelEntry]) -> None:
    """Two models may not answer to one name."""
    seen: dict[str, str] = {}
    for entry in models:
        for name in entry.names():
            if name in seen:
                raise ModelsFileError(f"the name {name!r} is given to both {seen[name]} and {entry.model}")
            seen[name] = entry.model


def write_models_file(path: Path, models: list[ModelEntry]) -> None:
    """Write [[models]] tables (model and names only: what a frontend reads)."""
    lines = []
    for entry in models:
        # A JSON string is a TOML basic string.
        lines += ["[[models]]", f"model = {json.dumps(entry.model)}",
                  f"served_model_name = {json.dumps(entry.served_model_name)}", ""]
    path.write_text("\n".join(lines))
