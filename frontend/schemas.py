"""Request and response bodies of every route, as pydantic models.

Requests are validated with these models; responses are written directly with orjson for speed, and
their models here exist so that /openapi.json describes them.
"""

from __future__ import annotations

import bisect
import itertools
import struct
from typing import Annotated, Any, Callable, Literal, Union

import numpy as np
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidatorFunctionWrapHandler
from pydantic.functional_validators import WrapValidator


class TokenIdList(list):
    """A flat list of token ids that also holds them as an int32 array, `ids`, made by the one pass that
    checked them (tokenization.check_ids takes the array instead of converting the list again). Never
    changed after validation: the array would no longer say what the list holds."""

    __slots__ = ("ids",)

    def __init__(self, values: list[int], ids: np.ndarray) -> None:
        super().__init__(values)
        self.ids = ids


class TokenIdLists(list):
    """Lists of token ids (one per input, none empty) that also hold them as one flat int32 array, `ids`,
    and each list's length, `lens`, made by the one pass that checked them. This is how the OpenAI
    client and the frameworks built on it send pre-tokenized inputs. Never changed after validation."""

    __slots__ = ("ids", "lens")

    def __init__(self, values: list[list[int]], ids: np.ndarray, lens: list[int]) -> None:
        super().__init__(values)
        self.ids = ids
        self.lens = lens


def _packed_int32(values: Any, count: int) -> np.ndarray | None:
    """`values` (an iterable of `count` items) as a read-only int32 array, or None when an item is not an
    int or is beyond int32. struct.pack refuses anything but ints (and objects with __index__) and ints
    beyond int32, but takes bools as 0 and 1: see _no_bools. That is exact for what JSON decodes to; other
    int-like objects (numpy integers, int subclasses) would pass as their value. (struct.pack over the
    unpacked items takes a third of the time of array('i'), np.fromiter or np.array over the same list.)"""
    try:
        packed = struct.pack(f"<{count}i", *values)
    except struct.error:
        return None
    return np.frombuffer(packed, dtype=np.int32)  # over the packed bytes: no copy


def _no_bools(ids: np.ndarray, item_at: Callable[[int], Any]) -> bool:
    """Whether none of the items packed into `ids` was a bool: only those that came out 0 or 1 are looked
    at again, by their flat position (a negative id, seen as unsigned, is above 1)."""
    unsigned = ids.view(np.uint32)
    return int(unsigned.min()) > 1 or all(type(item_at(i)) is int for i in np.flatnonzero(unsigned <= 1).tolist())


def _token_ids_at_once(value: Any, validate: ValidatorFunctionWrapHandler) -> Any:
    """A flat list of ints, or a list of such lists, is taken as it is, as the union would take it: the
    union tries list[StrictStr] first, which fails on every id (tens of µs for a hundred ids), and
    list[list[StrictInt]] last. Ids are checked and converted in one pass (_packed_int32); ids that int32
    holds (any vocabulary's) come back as a TokenIdList or TokenIdLists carrying the array. Anything else
    is validated by the union itself, so its errors are the union's."""
    if type(value) is not list or not value:
        return validate(value)
    if type(value[0]) is list:
        return _token_id_lists(value, validate)
    ids = _packed_int32(value, len(value))
    if ids is None:  # not all ints, or ints beyond int32 (out of any vocabulary: check_ids says which)
        return value if set(map(type, value)) == {int} else validate(value)
    if not _no_bools(ids, value.__getitem__):
        return validate(value)
    return TokenIdList(value, ids)


def _token_id_lists(value: list[Any], validate: ValidatorFunctionWrapHandler) -> Any:
    """Lists of token ids as a TokenIdLists; anything else (an empty list among them, an item that is
    not a list or not an int32 int) through the union."""
    lens = list(map(len, value)) if all(type(row) is list for row in value) else []
    if not lens or min(lens) == 0:
        return validate(value)
    one_row = len(value) == 1
    ids = _packed_int32(value[0] if one_row else itertools.chain.from_iterable(value), sum(lens))
    if ids is None:
        return validate(value)
    if one_row:
        item_at = value[0].__getitem__
    else:
        starts = list(itertools.accumulate(lens, initial=0))

        def item_at(position: int) -> Any:
            row = bisect.bisect_right(starts, position) - 1
            return value[row][position - starts[row]]

    if not _no_bools(ids, item_at):
        return validate(value)
    return TokenIdLists(value, ids, lens)


TokenIds = list[StrictInt]
Inputs = Annotated[Union[StrictStr, list[StrictStr], TokenIds, list[TokenIds]], WrapValidator(_token_ids_at_once)]
Direction = Literal["left", "right", "Left", "Right"]
EncodingFormat = Literal["float", "base64", "int8", "binary", "ubinary", "base64_int8", "base64_binary"]
OutputName = Literal["dense", "sparse", "colbert"]

MODEL_HELP = ("which served model answers (GET /v1/models lists them; default: the first); with one model "
              "any name is accepted unless the server runs with --strict-model-name")
INSTRUCTION_HELP = ("a task instruction, written in the model's instruction format before each input "
                    "(Qwen3-Embedding: 'Instruct: {instruction}\\nQuery:{input}'); not with prompt_name")
RERANK_INSTRUCTION_HELP = "Qwen3-Reranker only: the <Instruct> of its prompt (default: web search)"
TRUNCATE_HELP = "truncate over-long inputs instead of answering 422 (default: the server's --auto-truncate)"
SPLIT_HELP = ("embed an input longer than the model's limit as windows of that many tokens and return their "
              "token-weighted mean, normalised as the model normalises (default: the server's --split-long-inputs)")


class Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


# OpenAI -----------------------------------------------------------------------------------------
class EmbeddingRequest(Request):
    """POST /v1/embeddings, as OpenAI's embeddings API."""

    input: Inputs = Field(description="a string, a list of strings, a list of token ids or a list of such lists")
    model: str | None = Field(None, description=MODEL_HELP)
    encoding_format: EncodingFormat = Field(
        "float",
        description="float; base64: little-endian float32; for models that emit quantized embeddings "
                    "(pplx-embed) also int8: round(127 tanh x), ubinary: sign bits packed into bytes "
                    "(first dimension in the high bit), binary: those bytes minus 128; "
                    "base64_int8 / base64_binary (Perplexity's names): the int8 / ubinary bytes, base64",
    )
    dimensions: StrictInt | None = Field(None, description="Matryoshka: keep the first N dimensions, renormalised")
    user: str | None = Field(None, description="accepted for compatibility; not used")
    truncate: bool | None = Field(None, description=TRUNCATE_HELP)
    truncation_direction: Direction = "right"
    prompt_name: str | None = Field(None, description="a prompt of the model's sentence-transformers config")
    instruction: StrictStr | None = Field(None, description=INSTRUCTION_HELP)
    split_long_inputs: bool | None = Field(None, description=SPLIT_HELP)
    outputs: list[OutputName] | None = Field(
        None, min_length=1,
        description="BGE-M3 models: which outputs each data item carries, from one forward pass: dense "
                    "(`embedding`, as without this field), sparse (`sparse_embedding`: [{index, value}], the "
                    "largest lexical weight per token id, ascending by id) and colbert (`colbert_embedding`: "
                    "one normalised vector per token but the first, in encoding_format); default [dense]")


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | list[int] | str


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingResponse(BaseModel):
    object: Literal["list"] = "list"
    data: list[EmbeddingData]
    model: str
    usage: Usage


class OpenAIErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class OpenAIError(BaseModel):
    error: OpenAIErrorDetail


# Text Embeddings Inference ----------------------------------------------------------------------
class TeiInputsRequest(Request):
    """The fields of Text Embeddings Inference's token-output routes (/embed_all, /embed_sparse)."""

    inputs: Inputs
    truncate: bool | None = Field(None, description=TRUNCATE_HELP)
    truncation_direction: Direction = "right"
    prompt_name: str | None = Field(None, description="a prompt of the model's sentence-transformers config")
    instruction: StrictStr | None = Field(None, description=INSTRUCTION_HELP)
    model: StrictStr | None = Field(None, description=MODEL_HELP)


class EmbedRequest(Request):
    """POST /embed, as Text Embeddings Inference."""

    inputs: Inputs
    normalize: bool = True
    truncate: bool | None = Field(None, description="default: the server's --auto-truncate")
    truncation_direction: Direction = "right"
    prompt_name: str | None = Field(None, description="a prompt of the model's sentence-transformers config")
    instruction: StrictStr | None = Field(None, description=INSTRUCTION_HELP)
    dimensions: StrictInt | None = None
    split_long_inputs: bool | None = Field(None, description=SPLIT_HELP)
    model: StrictStr | None = Field(None, description=MODEL_HELP)


class RerankRequest(Request):
    """POST /rerank, as Text Embeddings Inference."""

    query: StrictStr
    texts: list[StrictStr]
    truncate: bool | None = Field(None, description=TRUNCATE_HELP)
    truncation_direction: Direction = "right"
    raw_scores: bool = Field(False, description="the model's logits instead of their sigmoid")
    return_text: bool = False
    instruction: StrictStr | None = Field(None, description=RERANK_INSTRUCTION_HELP)
    model: StrictStr | None = Field(None, description=MODEL_HELP)


class Rank(BaseModel):
    index: int
    score: float
    text: str | None = None


class PredictRequest(Request):
    """POST /predict, as Text Embeddings Inference: a text, a pair [a, b], or a list of those.

    A list of exactly two strings is one pair, as in Text Embeddings Inference; send [[a], [b]] or
    three or more strings for a batch of single texts.
    """

    inputs: Union[StrictStr, list[Union[StrictStr, list[StrictStr]]]]
    truncate: bool | None = Field(None, description=TRUNCATE_HELP)
    truncation_direction: Direction = "right"
    raw_scores: bool = Field(False, description="logits instead of softmax (sigmoid for one label)")
    model: StrictStr | None = Field(None, description=MODEL_HELP)


class Prediction(BaseModel):
    score: float
    label: str


class TokenizeRequest(Request):
    """POST /tokenize, as Text Embeddings Inference."""

    inputs: Union[StrictStr, list[StrictStr]]
    add_special_tokens: bool = True
    prompt_name: str | None = None
    instruction: StrictStr | None = Field(None, description=INSTRUCTION_HELP)
    model: StrictStr | None = Field(None, description=MODEL_HELP)


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class TEIError(BaseModel):
    error: str
    error_type: str


# Cohere / Jina ----------------------------------------------------------------------------------
class RerankDocument(Request):
    text: StrictStr


class CohereRerankRequest(Request):
    """POST /v1/rerank and /v2/rerank, as Cohere's (v1 and v2), Jina's and vLLM's rerank APIs."""

    query: StrictStr
    documents: list[Union[StrictStr, RerankDocument]]
    model: str | None = Field(None, description=MODEL_HELP)
    top_n: StrictInt | None = Field(None, ge=0, description="keep the N best results (0 or absent: all)")
    return_documents: bool | None = Field(None, description="include each result's document (default: no on "
                                                         "/v1/rerank, as Cohere; yes on /v2/rerank, as vLLM)")
    truncate: bool | None = Field(None, description=TRUNCATE_HELP)
    instruction: StrictStr | None = Field(None, description=RERANK_INSTRUCTION_HELP)


class RerankResult(BaseModel):
    index: int
    relevance_score: float
    document: RerankDocument | None = None


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class CohereRerankResponse(BaseModel):
    id: str
    model: str
    results: list[RerankResult]
    usage: RerankUsage


# vLLM -------------------------------------------------------------------------------------------
class ScoreRequest(Request):
    """POST /score and /v1/score, as vLLM's score API: 1:1, 1:N (one text_1) or N:N (zipped) pairs.

    vLLM's other names are accepted: queries or data_1 for text_1; documents, items or data_2 for text_2.
    """

    text_1: Union[StrictStr, list[StrictStr]] = Field(validation_alias=AliasChoices("text_1", "queries", "data_1"))
    text_2: Union[StrictStr, list[StrictStr]] = Field(
        validation_alias=AliasChoices("text_2", "documents", "items", "data_2"))
    model: str | None = Field(None, description=MODEL_HELP)
    truncate: bool | None = Field(None, description=TRUNCATE_HELP)
    raw_scores: bool = Field(False, description="the model's logits instead of their sigmoid")
    use_activation: bool | None = Field(None, description="vLLM: false answers the raw logits (as raw_scores)")
    instruction: StrictStr | None = Field(None, description=RERANK_INSTRUCTION_HELP)


class ScoreData(BaseModel):
    index: int
    object: Literal["score"] = "score"
    score: float


class ScoreUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0


class ScoreResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ScoreData]
    usage: ScoreUsage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class Info(BaseModel):
    model_id: str
    model_type: str
    model_kind: str
    architecture: str
    dimensions: int
    max_input_length: int
    pooling: str
    normalize: bool
    prompts: dict[str, str]
    default_prompt_name: str | None
    instruction_template: str | None
    encoding_formats: list[str]
    long_inputs: list[str]
    labels: dict[str, str] | None
    limits: dict[str, float]
    version: str
    models: list[str]


EMBED_RESPONSE_SCHEMA = {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}
RERANK_RESPONSE_SCHEMA = {"type": "array", "items": {"$ref": "#/components/schemas/Rank"}}
_PREDICTIONS = {"type": "array", "items": {"$ref": "#/components/schemas/Prediction"}}
PREDICT_RESPONSE_SCHEMA = {"oneOf": [_PREDICTIONS, {"type": "array", "items": _PREDICTIONS}]}
TOKENIZE_RESPONSE_SCHEMA = {"type": "array", "items": {"type": "array", "items": {"$ref": "#/components/schemas/SimpleToken"}}}
