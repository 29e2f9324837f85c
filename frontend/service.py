"""What the routes share: the model's facts, the tokenizer, the pipeline to the workers.

Routes parse their API's request format, call one of these methods with plain arguments, and
write the answer in their API's response format.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from common.config import FrontendSettings
from common.model_info import KIND_EMBEDDING, ModelInfo
from common.protocol import TASK_EMBED
from frontend import metrics
from frontend.broker_client import BrokerClient
from frontend.errors import APIError
from frontend.pipeline import Pipeline, Timings
from frontend.tokenization import Sequences, TextTokenizer


@dataclass
class Embeddings:
    rows: np.ndarray  # float32 [num_inputs, dim]
    num_tokens: int
    timings: Timings


def as_input_list(inputs: object) -> tuple[list[str] | None, list[list[int]] | None]:
    """(texts, None) or (None, token id lists) from a string, strings, token ids or lists of them."""
    if isinstance(inputs, str):
        return [inputs], None
    assert isinstance(inputs, list)
    if not inputs:
        return [], None
    if isinstance(inputs[0], str):
        return inputs, None  # type: ignore[return-value]
    if isinstance(inputs[0], int):
        return None, [inputs]  # type: ignore[list-item]
    return None, inputs  # type: ignore[return-value]


def matryoshka(rows: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """Keep the first `dimensions` columns, then (if asked) scale each row to unit length."""
    if dimensions is not None and dimensions < rows.shape[1]:
        rows = rows[:, :dimensions]
        if normalize:
            norms = np.linalg.norm(rows, axis=1, keepdims=True)
            rows = rows / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(rows, dtype=np.float32)


class Service:
    def __init__(self, settings: FrontendSettings, info: ModelInfo, client: BrokerClient) -> None:
        self.settings = settings
        self.info = info
        self.model_name = settings.served_model_name or info.name
        self.tokenizer = TextTokenizer(info)
        self.client = client
        self.pipeline = Pipeline(client, settings)

    def check_count(self, count: int, param: str) -> None:
        if count == 0:
            raise APIError("empty_input", f"'{param}' must not be empty", param=param)
        if count > self.settings.max_inputs:
            raise APIError("too_many_inputs",
                           f"'{param}' holds {count} inputs; at most {self.settings.max_inputs} are allowed in one request",
                           param=param)

    def check_texts(self, texts: list[str], param: str) -> None:
        for index, text in enumerate(texts):
            if not text:
                raise APIError("empty_input", f"input {index} is an empty string", param=param)
            if len(text) > self.settings.max_input_chars:
                raise APIError("body_too_large",
                               f"input {index} has {len(text)} characters; at most {self.settings.max_input_chars} are allowed",
                               param=param)

    def prompt_for(self, prompt_name: str | None) -> str:
        name = prompt_name if prompt_name is not None else self.info.default_prompt_name
        if name is None:
            return ""
        if name not in self.info.prompts:
            known = ", ".join(sorted(self.info.prompts)) or "none"
            raise APIError("validation", f"prompt_name {name!r} is not one of the model's prompts ({known})",
                           param="prompt_name")
        return self.info.prompts[name]

    def check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is None:
            return
        size = self.info.output_dim
        if not 1 <= dimensions <= size:
            raise APIError("invalid_request", f"dimensions must lie in [1, {size}] for this model, got {dimensions}",
                           param="dimensions")

    def require_kind(self, kind: str, route: str) -> None:
        if self.info.kind != kind:
            raise APIError("wrong_model_kind",
                           f"{route} needs an {kind} model; this server runs {self.model_name}, a {self.info.kind} model")

    async def tokenize(self, inputs: object, truncate: bool | None, direction: str, prompt_name: str | None,
                       param: str, timings: Timings) -> Sequences:
        texts, ids = as_input_list(inputs)
        self.check_count(len(texts if texts is not None else ids), param)  # type: ignore[arg-type]
        do_truncate = self.settings.auto_truncate if truncate is None else truncate
        started = time.monotonic()
        if texts is not None:
            self.check_texts(texts, param)
            prompt = self.prompt_for(prompt_name)
            if prompt:
                texts = [prompt + text for text in texts]
            seqs = await self.tokenizer.encode(texts, do_truncate, direction)
        else:
            seqs = self.tokenizer.check_ids(ids, do_truncate, direction)  # type: ignore[arg-type]
        timings.tokenization_s = time.monotonic() - started
        return seqs

    async def embed(self, inputs: object, *, route: str, truncate: bool | None, direction: str,
                    prompt_name: str | None, normalize: bool, dimensions: int | None, param: str) -> Embeddings:
        timings = Timings(started=time.monotonic())
        self.require_kind(KIND_EMBEDDING, route)
        self.check_dimensions(dimensions)
        seqs = await self.tokenize(inputs, truncate, direction, prompt_name, param, timings)
        metrics.INPUT_TOKENS.labels(route).observe(seqs.num_tokens)
        metrics.INPUTS.labels(route).observe(seqs.num_seqs)
        rows = await self.pipeline.run(seqs, TASK_EMBED, normalize, timings)
        return Embeddings(matryoshka(rows, dimensions, normalize), seqs.num_tokens, timings)
