"""The correctness gate for BGE-M3's outputs beyond the dense vector: sparse lexical weights (POST
/embed_sparse) and ColBERT vectors (POST /embed_all), served against float32 transformers on the same
texts with the checkpoint's own sparse_linear.pt and colbert_linear.pt.

The reference follows BGE-M3's published definition: the encoder's final hidden states; per token
relu(sparse_linear(h)), the largest weight kept per token id, the tokenizer's cls, eos, pad and unk
tokens left out; colbert_linear(h) on every token but the first, each row normalised. Lexical weights
pass when every input's weights, as vectors over the vocabulary, have a cosine of at least min_cosine
with the reference's; ColBERT vectors when every input has as many as the reference and their mean
cosine is at least min_cosine.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import torch

from quiver.bench.api import densify
from quiver.bench.gate import GateFailed, cosines, judge_embeddings
from quiver.bench.inprocess import TransformersRunner, Unsupported
from quiver.bench.targets import HttpTarget
from quiver.common.model_info import M3_HEAD_FILES


class M3Reference:
    """BGE-M3's sparse and ColBERT outputs in float32: the gate's transformers encoder and tokenizer, with
    the checkpoint's two head files."""

    def __init__(self, runner: TransformersRunner) -> None:
        from transformers import AutoTokenizer

        info, self.device = runner.info, runner.device
        self.encoder, self.tokenizer = runner.model, runner.tokenizer
        hidden = info.hidden_size
        self.sparse_linear = torch.nn.Linear(hidden, 1).to(self.device)
        self.colbert_linear = torch.nn.Linear(hidden, hidden).to(self.device)
        for layer, name in zip((self.sparse_linear, self.colbert_linear), M3_HEAD_FILES):
            layer.load_state_dict(torch.load(info.path / name, map_location=self.device, weights_only=True))
        try:
            hf_tokenizer = AutoTokenizer.from_pretrained(str(info.path))
        except Exception as exc:  # any reason the special tokens cannot be named
            raise Unsupported(f"transformers cannot load the tokenizer to name its special tokens: {exc}") from exc
        self.unused_ids = {i for i in (hf_tokenizer.cls_token_id, hf_tokenizer.eos_token_id,
                                       hf_tokenizer.pad_token_id, hf_tokenizer.unk_token_id) if i is not None}

    @torch.inference_mode()
    def outputs(self, text: str) -> tuple[dict[int, float], np.ndarray]:
        """(lexical weights by token id, ColBERT vectors [tokens - 1, hidden]) of one text."""
        ids = self.tokenizer.encode(text).ids
        hidden = self.encoder(input_ids=torch.tensor([ids], device=self.device)).last_hidden_state[0].float()
        weights = torch.relu(self.sparse_linear(hidden))[:, 0].cpu().numpy()
        lexical: dict[int, float] = {}
        for token, weight in zip(ids, weights):
            if token not in self.unused_ids and weight > 0:
                lexical[token] = max(lexical.get(token, 0.0), float(weight))
        colbert = torch.nn.functional.normalize(self.colbert_linear(hidden[1:]), dim=-1)
        return lexical, colbert.cpu().numpy()


async def _post_json(target: HttpTarget, path: str, body: dict[str, Any]) -> Any:
    return json.loads(await target.post(path, json.dumps(body).encode()))


async def check_m3_outputs(target: HttpTarget, runner: TransformersRunner, texts: list[str],
                           min_cosine: float) -> dict[str, Any]:
    """The verdicts on the sparse and ColBERT outputs; raises GateFailed when either diverges."""
    try:
        reference = M3Reference(runner)
    except Unsupported as exc:
        return {"message": f"not checked: {exc}"}
    expected = [reference.outputs(text) for text in texts]
    info = runner.info
    labels = [f"text {i} ({len(t)} chars)" for i, t in enumerate(texts)]

    served_sparse = densify(await _post_json(target, "/embed_sparse", {"inputs": texts}), info.vocab_size)
    expected_sparse = densify([[{"index": k, "value": v} for k, v in lexical.items()] for lexical, _ in expected],
                              info.vocab_size)
    sparse = judge_embeddings(f"{target.name} sparse", served_sparse, expected_sparse, labels, min_cosine)
    sparse["max_error"] = round(float(np.abs(served_sparse - expected_sparse).max()), 6)

    served_colbert = await _post_json(target, "/embed_all", {"inputs": texts})
    means, worst_token = [], 1.0
    for label, vectors, (_, want) in zip(labels, served_colbert, expected):
        got = np.asarray(vectors, dtype=np.float32)
        if got.shape != want.shape:
            raise GateFailed(f"{target.name}: ColBERT vectors of {label} have shape {got.shape}, the reference "
                             f"{want.shape}; nothing was timed")
        values = cosines(got, want)
        means.append(float(values.mean()))
        worst_token = min(worst_token, float(values.min()))
    worst = int(np.argmin(means))
    colbert = {"kind": "colbert", "inputs": len(means), "min_mean_cosine": round(means[worst], 6),
               "min_token_cosine": round(worst_token, 6), "threshold": min_cosine,
               "passed": bool(means[worst] >= min_cosine)}
    if not colbert["passed"]:
        raise GateFailed(f"{target.name}: ColBERT vectors diverge from the float32 reference: mean cosine "
                         f"{means[worst]:.6f} at {labels[worst]} is below {min_cosine}; nothing was timed", colbert)
    return {"sparse": sparse, "colbert": colbert}
