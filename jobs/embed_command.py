"""`quiver embed`: embed a file of texts through Quiver, resumably, into Parquet or .npy.

    quiver embed corpus.parquet --field body --id-field doc_id -o vectors.parquet --url http://127.0.0.1:8080
    quiver embed notes.txt -o notes.npy                  # no --url: starts a Quiver of its own, as `quiver serve`
    quiver embed corpus.parquet -o vectors.parquet --resume   # after a crash or Ctrl-C: continues where it stopped

Inputs: JSONL (a field), CSV (a column), Parquet (a column) or plain text (one text per line). Output:
Parquet with columns id and vector (float32, or the server's int8 / binary / ubinary encodings), or
.npy with the vectors and OUTPUT.ids.npy beside it, in input order. Work is committed in parts under
OUTPUT.parts/ and written to OUTPUT.tmp as it goes, renamed to OUTPUT at the end; a text the server
refuses is written to OUTPUT.failed.jsonl and the job goes on.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

FORMATS = ("jsonl", "csv", "parquet", "text")
ENCODING_NAMES = ("float", "int8", "binary", "ubinary")


def add_embed_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `embed` on quiver's command parser (entry point group quiver.commands)."""
    summary = "embed a file of texts (JSONL, CSV, Parquet, text) into Parquet or .npy, resumably"
    parser = subparsers.add_parser("embed", help=summary, description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("input", type=Path, help="the file of texts")
    parser.add_argument("-o", "--output", type=Path, required=True, help="OUTPUT.parquet or OUTPUT.npy")
    parser.add_argument("--url", default="", help="a running Quiver (default: start one here, as `quiver serve`)")
    parser.add_argument("--api-key", default=os.environ.get("QUIVER_API_KEY", ""), help="the server's API key")
    parser.add_argument("--format", choices=("auto", *FORMATS), default="auto", help="input format (default: by suffix)")
    parser.add_argument("--field", default="text", help="JSONL field or CSV/Parquet column of the text")
    parser.add_argument("--id-field", default="", help="field or column of the id (default: the record's position)")
    parser.add_argument("--encoding", choices=ENCODING_NAMES, default="float",
                        help="float32, or a quantised encoding the model emits")
    parser.add_argument("--dimensions", type=int, default=None, help="Matryoshka: keep the first N dimensions")
    parser.add_argument("--prompt-name", default=None, help="a prompt of the model's sentence-transformers config")
    parser.add_argument("--truncate", action=argparse.BooleanOptionalAction, default=True,
                        help="truncate texts over the model's limit instead of failing them")
    parser.add_argument("--batch-size", type=int, default=64, help="texts per request")
    parser.add_argument("--concurrency", type=int, default=8, help="requests in flight")
    parser.add_argument("--part-size", type=int, default=4096, help="texts per committed part")
    parser.add_argument("--priority", choices=("background", "online"), default="background",
                        help="background (default): the server runs online requests first; online: as one of them")
    parser.add_argument("--resume", action="store_true", help="continue the job whose parts are in OUTPUT.parts/")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--model", default="", help="embedded server only: checkpoint directory")
    parser.add_argument("--workers", type=int, default=0, help="embedded server only: CPU workers (0: as serve)")
    parser.add_argument("--device", default="", help="embedded server only: cpu or cuda")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Imported only when `quiver embed` runs, so that every other `quiver` command starts fast."""
    from quiver.jobs.embed_cli import run as run_embed

    return run_embed(args)
