"""Python's garbage-collector pauses in every process of a running `quiver serve`, as the traffic meets them.

`install DIR` writes a sitecustomize module into DIR/site; a process started with DIR/site on PYTHONPATH
and GC_PAUSES=DIR set logs each collection of generation 1 or 2, and any collection longer than 0.5 ms,
with its generation, length and the process's command line, into DIR/PID.log. `summary DIR` prints, per
process of the server, how many collections of each generation it made and the longest, and how many fell inside the
window [--since, --until] (time.monotonic() seconds, one clock for every process of a Linux host).
Nothing of it is in the served code.

    python -m quiver.bench.gc_pauses install /tmp/gc      # prints the folder to put on PYTHONPATH
    GC_PAUSES=/tmp/gc PYTHONPATH=/tmp/gc/site quiver serve ...
    python -m quiver.bench.gc_pauses summary /tmp/gc [--since T0 --until T1]
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

PROBE = '''
import os
if os.environ.get("GC_PAUSES"):
    import gc, sys, time
    _out = open(os.path.join(os.environ["GC_PAUSES"], f"{os.getpid()}.log"), "a", buffering=1)
    _out.write("argv " + " ".join(sys.orig_argv)[:160].replace("\\n", " ") + "\\n")
    _started = [0.0]

    def _on_collection(phase, info):
        if phase == "start":
            _started[0] = time.perf_counter()
            return
        took_ms = (time.perf_counter() - _started[0]) * 1e3
        if info["generation"] >= 1 or took_ms > 0.5:
            _out.write(f"{time.monotonic():.6f} {info['generation']} {took_ms:.3f}\\n")

    gc.callbacks.append(_on_collection)
'''


def install(folder: Path) -> Path:
    site = folder / "site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(PROBE)
    return site


def summary(folder: Path, since: float, until: float) -> str:
    lines = ["| process | generation | collections | longest ms | total ms | in the window | longest in it, ms |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for path in sorted(folder.glob("*.log")):
        argv, pauses = "", collections.defaultdict(list)
        for line in path.read_text().splitlines():
            if line.startswith("argv "):
                argv = line[5:]
                continue
            try:
                when, generation, took = line.split()
                pauses[int(generation)].append((float(when), float(took)))
            except ValueError:
                continue  # the rest of a command line that held a newline
        role = next((word for word in ("frontend", "broker", "worker", "serve") if f"-m quiver {word}" in argv), "")
        if not role:
            continue  # a helper process of the benchmark, not one of the server's
        for generation in sorted(pauses):
            took = [t for _, t in pauses[generation]]
            inside = [t for when, t in pauses[generation] if since <= when <= until]
            lines.append(f"| {role} ({path.stem}) | {generation} | {len(took)} | {max(took):.2f} | {sum(took):.1f} | "
                         f"{len(inside)} | {max(inside) if inside else 0:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=("install", "summary"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--since", type=float, default=0.0, help="window start, time.monotonic() seconds")
    parser.add_argument("--until", type=float, default=float("inf"), help="window end, time.monotonic() seconds")
    args = parser.parse_args(argv)
    if args.action == "install":
        print(install(args.folder))
    else:
        print(summary(args.folder, args.since, args.until))
    return 0


if __name__ == "__main__":
    sys.exit(main())
