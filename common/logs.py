"""One log format for every process, so interleaved output from `quiver serve` stays readable."""

from __future__ import annotations

import logging
import sys


def setup_logging(level: str, role: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)-7s {role}[%(process)d] %(name)s: %(message)s",
        stream=sys.stderr,
        force=True,
    )
