"""`quiver bench`: measure a running Quiver over HTTP, beside in-process baselines and other servers.

    quiver bench --url http://127.0.0.1:8080 --model DIR --out bench/out/run1
    quiver bench --quick                      # CI-size smoke run against the packaged MiniLM

Every option can also come from a QUIVER_BENCH_* environment variable; `quiver bench --help` lists them.
"""

from __future__ import annotations

import argparse
import sys

from quiver.bench.config import add_options, config_from_args


def add_bench_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register `bench` on quiver's command parser, with run=<callable(args) -> exit status>."""
    summary = "benchmark a running Quiver (and baselines) over HTTP; writes JSON, Markdown and plots"
    parser = subparsers.add_parser("bench", help=summary, description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
    add_options(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    try:
        config = config_from_args(args)
    except ValueError as exc:
        print(f"quiver bench: {exc}", file=sys.stderr)
        return 2
    from quiver.bench.suite import run_suite

    return run_suite(config)


def main(argv: list[str] | None = None) -> int:
    """`python -m quiver.bench.cli ...`: the same command where the quiver-bench distribution is not
    installed (a source tree on PYTHONPATH, as on a GPU machine), so `quiver bench` has no entry point."""
    parser = argparse.ArgumentParser(prog="quiver")
    add_bench_parser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["bench", *(sys.argv[1:] if argv is None else argv)])
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
