"""How embedding rows are written in a response: floats, base64 floats, or a model's quantized forms.

`float` and `base64` (little-endian float32, as OpenAI's client decodes it) suit every model. Models
that emit quantized embeddings the way pplx-embed's card describes (its sentence-transformers
pipeline ends in a tanh quantizer) also answer:

- `int8`:    round(127 * tanh(x)), clamped to [-128, 127], one integer per dimension;
- `ubinary`: the sign bits (x >= 0 is 1) packed eight to a byte, first dimension in the highest bit
             (numpy.packbits), as unsigned bytes 0..255; the last byte is padded with zero bits;
- `binary`:  the same bytes as signed integers (byte - 128), sentence-transformers' and Cohere's
             `binary` convention;
- `base64_int8`, `base64_binary`: Perplexity's API's names for the `int8` bytes and the `ubinary` bytes,
             each row base64-encoded.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from quiver.common.model_info import QUANTIZER_TANH

FLOAT_FORMATS = ("float", "base64")
QUANTIZED_FORMATS = ("int8", "binary", "ubinary", "base64_int8", "base64_binary")
ENCODING_FORMATS = FLOAT_FORMATS + QUANTIZED_FORMATS


def formats_for(quantizer: str | None) -> tuple[str, ...]:
    """The encoding formats a model with this quantizer (None: a plain float model) can answer in."""
    return ENCODING_FORMATS if quantizer == QUANTIZER_TANH else FLOAT_FORMATS


def tanh_int8(rows: np.ndarray) -> np.ndarray:
    scaled = np.rint(np.tanh(rows.astype(np.float32)) * np.float32(127.0))
    return np.clip(scaled, -128, 127).astype(np.int8)


def packed_sign_bits(rows: np.ndarray, signed: bool) -> np.ndarray:
    """[n, ceil(dim / 8)] bytes of sign bits; int8 (byte - 128) when signed, else uint8."""
    packed = np.packbits(rows >= 0, axis=-1)
    if signed:
        return (packed.astype(np.int16) - 128).astype(np.int8)
    return packed


def encode_rows(rows: np.ndarray, encoding_format: str) -> list[Any]:
    """One JSON value per row: a float list, a base64 string, or an integer list."""
    if encoding_format == "float":
        return list(rows)
    if encoding_format == "base64":
        little_endian = np.ascontiguousarray(rows, dtype="<f4")
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in little_endian]
    if encoding_format == "int8":
        return tanh_int8(rows).tolist()
    if encoding_format in ("binary", "ubinary"):
        return packed_sign_bits(rows, signed=encoding_format == "binary").tolist()
    if encoding_format == "base64_int8":
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in tanh_int8(rows)]
    if encoding_format == "base64_binary":
        return [base64.b64encode(row.tobytes()).decode("ascii") for row in packed_sign_bits(rows, signed=False)]
    raise ValueError(f"unknown encoding format {encoding_format!r}")
