"""Request and response bodies of every route, as pydantic models.

Requests are validated with these models; responses are written directly with orjson for speed, and
their models here exist so that /openapi.json describes them.
"""

from __future__ import annotations

from typing import Literal, Union

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr

TokenIds = list[StrictInt]
Inputs = Union[StrictStr, list[StrictStr], TokenIds, list[TokenIds]]
Direction = Literal["left", "right", "Left", "Right"]


class Request(BaseModel):
    model_config = ConfigDict(extra="ignore")


# OpenAI -----------------------------------------------------------------------------------------
class EmbeddingRequest(Request):
    """POST /v1/embeddings, as OpenAI's embeddings API."""

    input: Inputs = Field(description="a string, a list of strings, a list of token ids or a list of such lists")
    model: str | None = Field(None, description="accepted for compatibility; the server runs one model")
    encoding_format: Literal["float", "base64"] = Field("float", description="base64: little-endian float32")
    dimensions: StrictInt | None = Field(None, description="Matryoshka: keep the first N dimensions, renormalised")
    user: str | None = Field(None, description="accepted for compatibility; not used")
    truncate: bool | None = Field(None, description="truncate over-long inputs instead of answering 422")
    truncation_direction: Direction = "right"


class EmbeddingData(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str


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
class EmbedRequest(Request):
    """POST /embed, as Text Embeddings Inference."""

    inputs: Inputs
    normalize: bool = True
    truncate: bool | None = Field(None, description="default: the server's --auto-truncate")
    truncation_direction: Direction = "right"
    prompt_name: str | None = Field(None, description="a prompt of the model's sentence-transformers config")
    dimensions: StrictInt | None = None


class TokenizeRequest(Request):
    """POST /tokenize, as Text Embeddings Inference."""

    inputs: Union[StrictStr, list[StrictStr]]
    add_special_tokens: bool = True
    prompt_name: str | None = None


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class TEIError(BaseModel):
    error: str
    error_type: str


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
    limits: dict[str, float]
    version: str


EMBED_RESPONSE_SCHEMA = {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}
TOKENIZE_RESPONSE_SCHEMA = {"type": "array", "items": {"type": "array", "items": {"$ref": "#/components/schemas/SimpleToken"}}}
