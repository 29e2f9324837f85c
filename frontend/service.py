"""What the routes share: the model's facts, the tokenizer, the pipeline to the workers.

Routes parse their API's request format, call one of these methods with plain arguments, and
write the answer in their API's response format. A Service runs one model (a frontend serving
several holds one Service each, frontend/models.py): embed() needs an embedding model, score() a
scorer (a cross-encoder with one label, or a reranker), classify() a classifier; any other
pairing is refused with reason "wrong_model_kind".
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from quiver.common.config import FrontendSettings
from quiver.common.model_info import KIND_CLASSIFIER, KIND_EMBEDDING, KIND_RERANKER, KIND_SPARSE, ModelInfo
from quiver.common.protocol import PRIORITY_ONLINE, TASK_CLASSIFY, TASK_EMBED, TASK_SCORE
from quiver.common.ragged import RaggedIds
from quiver.frontend import metrics
from quiver.frontend.admission import CURRENT_TICKET, Admission
from quiver.frontend.broker_client import BrokerClient
from quiver.frontend.errors import APIError
from quiver.frontend.overlap import OverlapSplit
from quiver.frontend.pipeline import CURRENT_PRIORITY, Pipeline, Timings
from quiver.frontend.quantize import formats_for
from quiver.frontend.scores import sigmoid, softmax
from quiver.frontend.templates import DEFAULT_RERANK_INSTRUCTION, QWEN3_RERANKER, with_instruction
from quiver.frontend.tokenization import LoopUse, TextInput, TextTokenizer, loop_use


@dataclass
class Embeddings:
    rows: np.ndarray  # float32 [num_inputs, dim]
    num_tokens: int
    timings: Timings


@dataclass
class Scores:
    values: np.ndarray  # float32: [num_pairs] for score(), [num_inputs, num_labels] for classify()
    num_tokens: int
    timings: Timings


def record_stages(route: str, timings: Timings, model: str) -> None:
    """The request's tokenization, queue and inference seconds, in the stage histogram."""
    for stage, seconds in (("tokenization", timings.tokenization_s), ("queue", timings.queue_s),
                           ("inference", timings.inference_s)):
        metrics.STAGE_SECONDS_BY[route, stage, model].observe(seconds)


# What each kind of model answers, for errors that refuse a route.
ROUTES_BY_KIND = {
    KIND_EMBEDDING: "/v1/embeddings, /embed, /embed_all and /score (cosine similarity)",
    KIND_SPARSE: "/embed_sparse",
    KIND_CLASSIFIER: "/predict (and /rerank, /v1/rerank and /score with one label)",
    KIND_RERANKER: "/rerank, /v1/rerank and /score",
}


def describe(info: ModelInfo) -> str:
    """The model's kind in words, as error messages name it."""
    if info.kind == KIND_CLASSIFIER:
        labels = info.output_dim
        return f"a classifier model with {labels} label{'s' if labels != 1 else ''}"
    return f"an {info.kind} model" if info.kind == KIND_EMBEDDING else f"a {info.kind} model"


def as_input_list(inputs: object) -> tuple[list[str] | None, list[list[int]] | None]:
    """(texts, None) or (None, token id lists) from a string, strings, token ids or lists of them."""
    if isinstance(inputs, str):
        return [inputs], None
    assert isinstance(inputs, list)
    if not inputs:
        return [], None
    if isinstance(inputs[0], str):
        return inputs, None
    if isinstance(inputs[0], int):
        return None, [inputs]
    return None, inputs


def served_names(option: str) -> list[str]:
    """The aliases of --served-model-name, 'a,b' -> ['a', 'b']; the first is the name in responses."""
    return [name.strip() for name in option.split(",") if name.strip()]


def matryoshka(rows: np.ndarray, dimensions: int | None, normalize: bool) -> np.ndarray:
    """Keep the first `dimensions` columns, then (if asked) scale each row to unit length."""
    if dimensions is not None and dimensions < rows.shape[1]:
        rows = rows[:, :dimensions]
        if normalize:
            norms = np.linalg.norm(rows, axis=1, keepdims=True)
            rows = rows / np.maximum(norms, 1e-12)
    return np.ascontiguousarray(rows, dtype=np.float32)


class Service:
    def __init__(self, settings: FrontendSettings, info: ModelInfo, client: BrokerClient,
                 admission: Admission | None = None, fingerprint: str = "") -> None:
        self.settings = settings
        self.info = info
        self.model_names = served_names(settings.served_model_name) or [info.name]
        self.model_name = self.model_names[0]
        # Named in every chunk, so that only this model's workers run it ('' : any worker).
        self.fingerprint = fingerprint
        self.client = client
        self.admission = admission or Admission(settings.max_inflight_tokens)
        self.tokenizer = TextTokenizer(info, settings.tokenization_pool_threads, self._loop_use)
        self.pipeline = Pipeline(client, settings, self.admission, fingerprint, self.model_name)
        self.overlap = OverlapSplit()
        self._first_share = metrics.SCORE_FIRST_SHARE.labels(self.model_name)
        self._first_share.set(self.overlap.share)

    def _loop_use(self) -> LoopUse:
        """loop_use for the current task: its priority, and its request's share of the in-flight tokens."""
        ticket = CURRENT_TICKET.get()
        return loop_use(CURRENT_PRIORITY.get() != PRIORITY_ONLINE, self.admission.inflight,
                        ticket.tokens if ticket is not None else 0)

    def check_model(self, model: str | None) -> None:
        """A server runs one model: any `model` is answered by it, as TEI does, and counted when it names
        none of the served names (or the checkpoint directory); with --strict-model-name such a request is 404."""
        if not model or model in self.model_names or model == self.info.path.name:
            return
        if self.settings.strict_model_name:
            raise APIError("not_found", f"the model {model!r} does not exist; this server runs "
                           f"{', '.join(repr(name) for name in self.model_names)}", param="model")
        metrics.OTHER_MODEL_NAMES.inc()

    def check_count(self, count: int, param: str) -> None:
        if count == 0:
            raise APIError("empty_input", f"'{param}' must not be empty", param=param)
        if count > self.settings.max_inputs:
            raise APIError("too_many_inputs",
                           f"'{param}' holds {count} inputs; at most {self.settings.max_inputs} are allowed in one request",
                           param=param)

    def check_texts(self, texts: list[str], param: str, allow_empty: bool = False) -> None:
        for index, text in enumerate(texts):
            if not text and not allow_empty:
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

    def input_prefix(self, prompt_name: str | None, instruction: str | None) -> str:
        """What goes before each text input: the instruction in the model's format, else the prompt."""
        if instruction is None:
            return self.prompt_for(prompt_name)
        if prompt_name is not None:
            raise APIError("invalid_request", "give either prompt_name or instruction, not both", param="instruction")
        if self.info.instruction_template is None:
            raise APIError("invalid_request", f"{self.model_name} takes no instruction", param="instruction")
        return with_instruction(self.info.instruction_template, instruction, "")

    def check_dimensions(self, dimensions: int | None) -> None:
        if dimensions is None:
            return
        size = self.info.output_dim
        if not 1 <= dimensions <= size:
            raise APIError("invalid_request", f"dimensions must lie in [1, {size}] for this model, got {dimensions}",
                           param="dimensions")

    def check_encoding_format(self, encoding_format: str) -> None:
        allowed = formats_for(self.info.quantizer)
        if encoding_format not in allowed:
            raise APIError("invalid_request",
                           f"encoding_format {encoding_format!r} is not available for {self.model_name}, which does "
                           f"not emit quantized embeddings; use one of {', '.join(allowed)}",
                           param="encoding_format")

    def require_kind(self, kind: str, route: str) -> None:
        if self.info.kind != kind:
            wanted = "an embedding model" if kind == KIND_EMBEDDING else f"a {kind} model"
            raise APIError("wrong_model_kind",
                           f"{route} needs {wanted}; this server runs {self.model_name}, {describe(self.info)}, "
                           f"which serves {ROUTES_BY_KIND[self.info.kind]}")

    def require_scorer(self, route: str) -> None:
        """Scoring needs one number per pair: a one-label cross-encoder or a reranker."""
        one_label = self.info.kind == KIND_CLASSIFIER and self.info.output_dim == 1
        if not (one_label or self.info.kind == KIND_RERANKER):
            raise APIError("wrong_model_kind",
                           f"{route} needs a scoring model (a cross-encoder with one label, or a reranker); "
                           f"this server runs {self.model_name}, {describe(self.info)}, "
                           f"which serves {ROUTES_BY_KIND[self.info.kind]}")

    def do_truncate(self, truncate: bool | None) -> bool:
        return self.settings.auto_truncate if truncate is None else truncate

    async def tokenize(self, inputs: object, truncate: bool | None, direction: str, prompt_name: str | None,
                       param: str, timings: Timings, instruction: str | None = None) -> RaggedIds:
        texts, ids = as_input_list(inputs)
        self.check_count(len(texts if texts is not None else ids), param)  # type: ignore[arg-type]
        started = time.monotonic()
        if texts is not None:
            self.check_texts(texts, param)
            prefix = self.input_prefix(prompt_name, instruction)
            if prefix:
                texts = [prefix + text for text in texts]
            seqs = await self.tokenizer.encode(texts, self.do_truncate(truncate), direction, param)
        else:
            seqs = await self.tokenizer.ids(ids, self.do_truncate(truncate), direction, param)
        timings.tokenization_s = time.monotonic() - started
        return seqs

    async def embed(self, inputs: object, *, route: str, truncate: bool | None, direction: str,
                    prompt_name: str | None, normalize: bool, dimensions: int | None, param: str,
                    instruction: str | None = None, encoding_format: str = "float") -> Embeddings:
        timings = Timings(started=time.monotonic())
        self.require_kind(KIND_EMBEDDING, route)
        self.check_dimensions(dimensions)
        self.check_encoding_format(encoding_format)
        seqs = await self.tokenize(inputs, truncate, direction, prompt_name, param, timings, instruction)
        self._observe(route, seqs.num_tokens, seqs.num_seqs)
        rows = await self.pipeline.run(seqs, TASK_EMBED, normalize, timings)
        record_stages(route, timings, self.model_name)
        return Embeddings(matryoshka(rows, dimensions, normalize), seqs.num_tokens, timings)

    async def score(self, query: str | list[str], documents: list[str], *, route: str, truncate: bool | None,
                    direction: str, raw_scores: bool, instruction: str | None, param: str) -> Scores:
        """One relevance score per (query, document) pair: one query for all, or one query per document.

        Sigmoid of the model's logit (a probability) unless raw_scores; for a reranker the logit is
        logit("yes") - logit("no"), so its sigmoid is the probability of "yes" over "no".
        """
        timings = Timings(started=time.monotonic())
        self.require_scorer(route)
        self.check_count(len(documents), param)
        queries = [query] * len(documents) if isinstance(query, str) else query
        self._check_pair_texts(queries, documents, param)
        do_truncate = self.do_truncate(truncate)
        started = time.monotonic()
        cut = self.overlap.cut(documents)
        if cut:
            first = await self._pair_sequences(queries[:cut], documents[:cut], do_truncate, direction, instruction,
                                               param)

            async def rest() -> RaggedIds:
                seqs = await self._pair_sequences(queries[cut:], documents[cut:], do_truncate, direction, instruction,
                                                  param, first_row=cut)
                timings.tokenization_s = time.monotonic() - started
                self._observe(route, first.num_tokens + seqs.num_tokens, len(documents))
                return seqs

            rows, num_tokens = await self.pipeline.run_overlapped(first, rest, TASK_SCORE, False, timings)
            self.overlap.observe(timings.tokenization_s, timings.device_s)
            self._first_share.set(self.overlap.share)
        else:
            seqs = await self._pair_sequences(queries, documents, do_truncate, direction, instruction, param)
            timings.tokenization_s = time.monotonic() - started
            self._observe(route, seqs.num_tokens, seqs.num_seqs)
            rows, num_tokens = await self.pipeline.run(seqs, TASK_SCORE, False, timings), seqs.num_tokens
        record_stages(route, timings, self.model_name)
        logits = rows[:, 0]
        values = logits if raw_scores else sigmoid(logits)
        return Scores(values, num_tokens, timings)

    async def classify(self, inputs: list[TextInput], *, route: str, truncate: bool | None, direction: str,
                       raw_scores: bool, param: str) -> Scores:
        """Label scores per input (a text, or a pair in the tokenizer's pair template).

        Softmax over the labels, or sigmoid for a one-label head, unless raw_scores.
        """
        timings = Timings(started=time.monotonic())
        self.require_kind(KIND_CLASSIFIER, route)
        self.check_count(len(inputs), param)
        self.check_texts([text for item in inputs for text in ((item,) if isinstance(item, str) else item)], param)
        started = time.monotonic()
        seqs = await self.tokenizer.encode(inputs, self.do_truncate(truncate), direction, param,
                                           with_types=self.info.uses_token_types)
        timings.tokenization_s = time.monotonic() - started
        self._observe(route, seqs.num_tokens, seqs.num_seqs)
        logits = await self.pipeline.run(seqs, TASK_CLASSIFY, False, timings)
        record_stages(route, timings, self.model_name)
        if raw_scores:
            values = logits
        else:
            values = sigmoid(logits) if logits.shape[1] == 1 else softmax(logits)
        return Scores(values, seqs.num_tokens, timings)

    def _check_pair_texts(self, queries: list[str], documents: list[str], param: str) -> None:
        """Queries must say something; an empty document is scored like any other."""
        if not all(queries):
            raise APIError("empty_input", "the query is an empty string", param="query")
        self.check_texts(queries, "query")
        self.check_texts(documents, param, allow_empty=True)

    async def _pair_sequences(self, queries: list[str], documents: list[str], truncate: bool, direction: str,
                              instruction: str | None, param: str, first_row: int = 0) -> RaggedIds:
        """The pairs' token ids; errors name a pair by its index plus first_row."""
        if self.info.kind == KIND_RERANKER:
            task = DEFAULT_RERANK_INSTRUCTION if instruction is None else instruction
            bodies = [QWEN3_RERANKER.body(task, q, d) for q, d in zip(queries, documents)]
            return await self.tokenizer.encode_prompts(QWEN3_RERANKER.prefix, bodies, QWEN3_RERANKER.suffix,
                                                       truncate, direction, param, first_row)
        if instruction is not None:
            raise APIError("invalid_request", f"{self.model_name}, {describe(self.info)}, takes no instruction",
                           param="instruction")
        return await self.tokenizer.encode(list(zip(queries, documents)), truncate, direction, param,
                                           with_types=self.info.uses_token_types, first_row=first_row)

    @staticmethod
    def _observe(route: str, num_tokens: int, num_inputs: int) -> None:
        metrics.INPUT_TOKENS_BY[route].observe(num_tokens)
        metrics.INPUTS_BY[route].observe(num_inputs)
