"""Benchmark inputs made of real English text: the Python standard library's own documentation.

The text is gathered offline at run time from `pydoc_data.topics` (the language reference pages that
`help()` shows) and from the docstrings of a fixed list of standard modules, their classes and their
methods. `TokenCorpus` cuts that text, with the served model's tokenizer, into token-id sequences of an
exact length and into texts that tokenize to a given length, so every benchmark sends real text.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import math
import random
import warnings
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

DOCSTRING_MODULES = (
    "abc", "argparse", "ast", "asyncio", "base64", "bisect", "calendar", "cmd", "codecs", "collections",
    "concurrent.futures", "configparser", "contextlib", "copy", "csv", "dataclasses", "datetime", "decimal",
    "difflib", "email", "enum", "fractions", "functools", "gettext", "glob", "gzip", "hashlib", "heapq", "hmac",
    "html.parser", "http.client", "http.server", "imaplib", "inspect", "io", "ipaddress", "itertools", "json",
    "logging", "mailbox", "math", "mimetypes", "multiprocessing", "numbers", "operator", "optparse", "os",
    "pathlib", "pickle", "pkgutil", "platform", "pprint", "queue", "random", "re", "sched", "secrets",
    "selectors", "shelve", "shlex", "shutil", "smtplib", "socket", "socketserver", "sqlite3", "ssl",
    "statistics", "string", "struct", "subprocess", "tarfile", "tempfile", "textwrap", "threading", "time",
    "timeit", "tokenize", "traceback", "types", "typing", "unittest", "urllib.parse", "urllib.request", "uuid",
    "warnings", "weakref", "xml.dom.minidom", "xml.etree.ElementTree", "zipfile", "zlib",
)

# A short question for the scoring benchmark: what a user would type into a search box.
SCORING_QUERY = "How do I read a compressed archive and list the files inside it?"


def _docstrings_of(module_name: str) -> list[str]:
    """The module's docstring, then its public classes', functions' and methods' (sorted by name)."""
    try:
        module = importlib.import_module(module_name)
    except ImportError:
        return []
    objects: list[object] = [module]
    for name in sorted(dir(module)):
        obj = getattr(module, name, None)
        if name.startswith("_") or not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        objects.append(obj)
        if inspect.isclass(obj):
            objects += [member for key, member in sorted(vars(obj).items()) if not key.startswith("_") and callable(member)]
    return [doc for doc in map(inspect.getdoc, objects) if doc]


def _without_rules(doc: str) -> str:
    """The text without lines that hold no letter or digit (rules such as "*****" or "====")."""
    return "\n".join(line for line in doc.strip().splitlines() if any(ch.isalnum() for ch in line))


@functools.lru_cache(maxsize=1)
def stdlib_documents() -> tuple[str, ...]:
    """Every distinct document, in a fixed order: reference topics first, then docstrings."""
    from pydoc_data.topics import topics

    with warnings.catch_warnings():  # deprecated aliases such as typing.io warn when touched
        warnings.simplefilter("ignore")
        docstrings = [doc for name in DOCSTRING_MODULES for doc in _docstrings_of(name)]
    seen: set[str] = set()
    documents = []
    for doc in [topics[key] for key in sorted(topics)] + docstrings:
        doc = _without_rules(doc)
        if len(doc) >= 40 and doc not in seen:
            seen.add(doc)
            documents.append(doc)
    return tuple(documents)


def special_affixes(tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
    """The special token ids the tokenizer puts before and after a single text (e.g. [CLS] ... [SEP])."""
    bare = tokenizer.encode("word", add_special_tokens=False).ids
    full = tokenizer.encode("word", add_special_tokens=True).ids
    for start in range(len(full) - len(bare) + 1):
        if full[start:start + len(bare)] == bare:
            return full[:start], full[start + len(bare):]
    raise ValueError("the tokenizer's special tokens do not wrap a text; cannot cut exact lengths")


def mixed_lengths(count: int, min_length: int, max_length: int, seed: int = 0) -> list[int]:
    """`count` lengths drawn log-uniformly from [min_length, max_length] tokens: many short texts and a
    long tail, as a document collection has."""
    rng = random.Random(seed)
    low, high = math.log(min_length), math.log(max_length)
    return [round(math.exp(rng.uniform(low, high))) for _ in range(count)]


class TokenCorpus:
    """The standard library's text as one long token stream, cut into inputs of chosen lengths.

    Lengths always count the special tokens the tokenizer adds. Successive cuts take successive windows
    of the stream (wrapping around at its end), so inputs differ from one another.
    """

    def __init__(self, tokenizer_path: Path | str, prompt: str = "") -> None:
        self.tokenizer = Tokenizer.from_file(str(tokenizer_path))
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.prompt = prompt
        self.prefix, self.suffix = special_affixes(self.tokenizer)
        self.stream_text = "\n\n".join(stdlib_documents())
        encoding = self.tokenizer.encode(self.stream_text, add_special_tokens=False)
        self.ids = np.asarray(encoding.ids, dtype=np.int64)
        self.offsets = encoding.offsets
        self.text_overhead = self.count_tokens([""])[0]  # the prompt's tokens and the special tokens
        self._cursor = 0

    @property
    def num_special(self) -> int:
        return len(self.prefix) + len(self.suffix)

    def _window_start(self, body_tokens: int, contiguous: bool) -> int:
        """Where the next window of body_tokens starts; a contiguous one never runs past the end."""
        span = len(self.ids) - body_tokens if contiguous else len(self.ids)
        if span < 1:
            raise ValueError(f"the corpus holds {len(self.ids)} tokens, too few for a text of {body_tokens}")
        start = self._cursor % span
        self._cursor = start + body_tokens
        return start

    def id_batch(self, length: int, count: int) -> np.ndarray:
        """`count` rows of token ids, each exactly `length` long with the special tokens (as a server
        receives them), as int64 [count, length]."""
        body = length - self.num_special
        if body < 1:
            raise ValueError(f"length {length} leaves no room beside {self.num_special} special tokens")
        rows = np.empty((count, length), dtype=np.int64)
        rows[:, :len(self.prefix)] = self.prefix
        rows[:, length - len(self.suffix):] = self.suffix
        for row in rows:
            start = self._window_start(body, contiguous=False)
            row[len(self.prefix):len(self.prefix) + body] = np.take(self.ids, np.arange(start, start + body), mode="wrap")
        return rows

    def count_tokens(self, texts: list[str]) -> list[int]:
        """Tokens of each text as the server counts them: prompt and special tokens included."""
        return [len(e.ids) for e in self.tokenizer.encode_batch([self.prompt + t for t in texts])]

    def text(self, length: int) -> str:
        """A text that tokenizes to `length` tokens (prompt and special tokens included), rarely fewer.

        The cut follows token boundaries of the long stream, but a cut text can tokenize a little
        differently on its own, so the window is widened or narrowed until the count is right; where it
        oscillates around the length, the longest cut that does not exceed it is taken.
        """
        size = length - self.text_overhead
        if size < 1:
            raise ValueError(f"length {length} leaves no room beside {self.text_overhead} prompt and special tokens")
        start = self._window_start(size, contiguous=True)
        best, best_count = "", 0
        for attempt in range(12):
            size = min(max(1, size), len(self.ids) - start)
            candidate = self.stream_text[self.offsets[start][0]:self.offsets[start + size - 1][1]]
            counted = self.count_tokens([candidate])[0]
            if counted == length:
                return candidate
            if best_count < counted < length:
                best, best_count = candidate, counted
            if attempt >= 6 and counted < length:
                break
            size += length - counted
        return best

    def texts(self, length: int, count: int) -> list[str]:
        return [self.text(length) for _ in range(count)]

    def mixed_texts(self, count: int, min_length: int, max_length: int, seed: int = 0) -> list[str]:
        """`count` texts of mixed_lengths(...) tokens."""
        return [self.text(length) for length in mixed_lengths(count, min_length, max_length, seed)]
