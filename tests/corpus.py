"""Real English sentences for tests, taken from the Python standard library's docstrings.

Deterministic (fixed modules, sorted names) and offline; a few multilingual and odd inputs are added
so that tokenization sees accents, CJK, emoji and punctuation too.
"""

from __future__ import annotations

import importlib
import inspect
import re

MODULES = (
    "argparse", "asyncio", "collections", "csv", "datetime", "decimal", "email", "fractions", "functools",
    "heapq", "http.client", "inspect", "json", "logging", "os", "pathlib", "random", "re", "shutil",
    "socket", "statistics", "string", "subprocess", "tarfile", "textwrap", "threading", "urllib.parse", "zipfile",
)

EXTRA = [
    "Le renard brun rapide saute par-dessus le chien paresseux.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "東京は日本の首都です。",
    "Emoji in text 🚀🔥 should still embed fine.",
    "ALL CAPS SENTENCE WITH NUMBERS 12345 AND SYMBOLS #@!",
    "a",
    "   leading and trailing spaces   ",
    "Tabs\tand\nnewlines\nin one input.",
]

_SPLIT = re.compile(r"(?<=[.!?])\s+")


def sentences(count: int = 300, min_chars: int = 20, max_chars: int = 400) -> list[str]:
    seen: set[str] = set()
    out: list[str] = list(EXTRA)
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        objects = [module] + [getattr(module, name) for name in sorted(dir(module)) if not name.startswith("_")]
        for obj in objects:
            doc = inspect.getdoc(obj) if callable(obj) or inspect.ismodule(obj) else None
            if not doc:
                continue
            for sentence in _SPLIT.split(" ".join(doc.split())):
                if min_chars <= len(sentence) <= max_chars and sentence not in seen and sentence[0].isalpha():
                    seen.add(sentence)
                    out.append(sentence)
                    if len(out) >= count:
                        return out[:count]
    return out[:count]
