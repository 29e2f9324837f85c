"""Request bodies and response parsing for the two API flavours a server may speak.

"openai": POST /v1/embeddings (OpenAI) and POST /v1/rerank (Cohere/Jina), as Quiver and vLLM serve them.
"tei": POST /embed and POST /rerank, as Text Embeddings Inference and Quiver serve them.
Both accept token ids in place of text, which the latency and throughput benchmarks rely on.
A sparse (SPLADE) model is embedded through POST /embed_sparse whatever the flavour (neither OpenAI
route serves it); its answers are read back as dense rows of the vocabulary's width.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np

from quiver.bench.http_client import HttpSession

Inputs = list[str] | list[list[int]]


@dataclass(frozen=True)
class ServerApi:
    flavour: str  # "openai" | "tei"
    model: str = ""  # the model name requests carry ("" leaves it out: the server's first model)
    sparse_dim: int = 0  # a sparse model's vocabulary size; 0 for dense embedders

    def embed_request(self, inputs: Inputs) -> tuple[str, bytes]:
        if self.sparse_dim:
            return "/embed_sparse", json.dumps({"inputs": inputs}).encode()
        if self.flavour == "openai":
            body: dict[str, Any] = {"input": inputs}
            if self.model:
                body["model"] = self.model
            return "/v1/embeddings", json.dumps(body).encode()
        return "/embed", json.dumps({"inputs": inputs, **({"model": self.model} if self.model else {})}).encode()

    def rerank_request(self, query: str, documents: list[str]) -> tuple[str, bytes]:
        if self.flavour == "openai":
            body: dict[str, Any] = {"query": query, "documents": documents}
            if self.model:
                body["model"] = self.model
            return "/v1/rerank", json.dumps(body).encode()
        return "/rerank", json.dumps({"query": query, "texts": documents,
                                      **({"model": self.model} if self.model else {})}).encode()

    def embeddings_of(self, body: bytes) -> np.ndarray:
        """float32 [inputs, dim] in input order."""
        parsed = json.loads(body)
        if self.sparse_dim:
            return densify(parsed, self.sparse_dim)
        if self.flavour == "openai":
            rows = [item["embedding"] for item in sorted(parsed["data"], key=lambda item: item["index"])]
        else:
            rows = parsed
        return np.asarray(rows, dtype=np.float32)

    def scores_of(self, body: bytes, count: int) -> np.ndarray:
        """One score per document, in document order (servers answer sorted by score)."""
        parsed = json.loads(body)
        items = parsed["results"] if self.flavour == "openai" else parsed
        key = "relevance_score" if self.flavour == "openai" else "score"
        scores = np.full(count, np.nan, dtype=np.float64)
        for item in items:
            scores[int(item["index"])] = float(item[key])
        return scores


def densify(rows: list[list[dict[str, Any]]], width: int) -> np.ndarray:
    """TEI's sparse answer ([{index, value}] per input) as float32 [inputs, width]."""
    dense = np.zeros((len(rows), width), dtype=np.float32)
    for i, row in enumerate(rows):
        if row:
            dense[i, [int(item["index"]) for item in row]] = [float(item["value"]) for item in row]
    return dense


async def get_json(session: HttpSession, path: str) -> Any | None:
    """The JSON body of a 200 answer to GET path, else None."""
    try:
        status, body = await session.request("GET", path)
    except Exception:  # noqa: BLE001 - any transport failure means "not this route"
        return None
    if status != 200:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


async def detect_api(session: HttpSession, flavour: str, model: str = "") -> ServerApi:
    """The API a server speaks: TEI when GET /info names a model_id, OpenAI when GET /v1/models answers.

    With flavour "openai" and no model name, the server's first model from /v1/models is used.
    """
    if flavour == "auto":
        info = await get_json(session, "/info")
        if isinstance(info, dict) and "model_id" in info:
            flavour = "tei"
        elif await get_json(session, "/v1/models") is not None:
            flavour = "openai"
        else:
            raise RuntimeError("neither GET /info (TEI) nor GET /v1/models (OpenAI) answered; pass the API flavour")
    if flavour == "openai" and not model:
        listing = await get_json(session, "/v1/models")
        if isinstance(listing, dict) and listing.get("data"):
            model = str(listing["data"][0].get("id", ""))
    return ServerApi(flavour, model if flavour == "openai" else "")
