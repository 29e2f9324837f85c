"""A model's identity, computed the same way by the frontend and the worker, so that the broker can
refuse a worker serving another model than its frontends tokenize for (wrong vectors with a 200).

The fingerprint hashes what decides the numbers: config.json, the tokenizer file, the
sentence-transformers files that set pooling and prompts, and per weights file its name, size,
safetensors header (names, dtypes, shapes, offsets) and a small sample of its data (the first and
last SAMPLE_BYTES after the header, so two checkpoints of one shape but different weights differ).
It reads a few hundred KiB whatever the checkpoint's size.
"""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

SAMPLE_BYTES = 64 * 1024
# Files read whole: they are small and each changes what the model computes.
DEFINING_FILES = ("config.json", "tokenizer.json", "modules.json", "sentence_bert_config.json",
                  "config_sentence_transformers.json", "1_Pooling/config.json")
WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.pt")
MAX_SAFETENSORS_HEADER = 100 * 1024 * 1024


def _weights_identity(path: Path, digest: hashlib._Hash) -> None:
    size = path.stat().st_size
    digest.update(f"{path.name}\0{size}\0".encode())
    with path.open("rb") as f:
        start = 0
        if path.suffix == ".safetensors" and size >= 8:
            (header_len,) = struct.unpack("<Q", f.read(8))
            if header_len <= min(size - 8, MAX_SAFETENSORS_HEADER):
                digest.update(f.read(header_len))
                start = 8 + header_len
        f.seek(start)
        digest.update(f.read(SAMPLE_BYTES))
        f.seek(max(start, size - SAMPLE_BYTES))
        digest.update(f.read(SAMPLE_BYTES))


def model_fingerprint(model_dir: str | Path) -> str:
    """A hex digest naming this checkpoint's model (see the module's docstring for what it covers)."""
    root = Path(model_dir)
    digest = hashlib.sha256()
    for name in DEFINING_FILES:
        file = root / name
        if file.is_file():
            digest.update(f"{name}\0".encode())
            digest.update(hashlib.sha256(file.read_bytes()).digest())
    for weights in sorted({p for pattern in WEIGHT_PATTERNS for p in root.glob(pattern) if p.is_file()}):
        _weights_identity(weights, digest)
    return digest.hexdigest()[:32]
