"""Text templates a model was trained with: Qwen3-Reranker's judging prompt and embedding instructions.

Qwen3-Reranker is a causal LM asked whether a document meets a query; its score is the probability
of "yes" over "no" as the next token after this prompt (the format of the model card):

    <|im_start|>system
    Judge whether the Document meets the requirements based on the Query and the Instruct provided.
    Note that the answer can only be "yes" or "no".<|im_end|>
    <|im_start|>user
    <Instruct>: {instruction}
    <Query>: {query}
    <Document>: {document}<|im_end|>
    <|im_start|>assistant
    <think>

    </think>

The fixed head and tail are tokenized once, apart from the body, as the model card's code does, so
that truncation only ever shortens the body.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_RERANK_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"

_SYSTEM = (
    'Judge whether the Document meets the requirements based on the Query and the Instruct provided. '
    'Note that the answer can only be "yes" or "no".'
)


@dataclass(frozen=True)
class RerankerPrompt:
    """A prompt cut in three: a fixed prefix, a body per (query, document), a fixed suffix."""

    prefix: str
    suffix: str

    def body(self, instruction: str, query: str, document: str) -> str:
        return f"<Instruct>: {instruction}\n<Query>: {query}\n<Document>: {document}"


QWEN3_RERANKER = RerankerPrompt(
    prefix=f"<|im_start|>system\n{_SYSTEM}<|im_end|>\n<|im_start|>user\n",
    suffix="<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n",
)


def with_instruction(template: str, instruction: str, text: str) -> str:
    """An embedding input in the model's instruction format, e.g. "Instruct: {task}\\nQuery:{text}"."""
    return template.replace("{instruction}", instruction) + text
