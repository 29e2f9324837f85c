"""Quiver: text embeddings and relevance scores served from GPUs.

The stage folders (`common/`, `broker/`, `worker/`, `frontend/`, and `bench/` from its own
distribution) live at the top of the repository; installed, setup.cfg's `package_dir` puts them inside
this package as `quiver.common`, `quiver.broker`, ... Run from a source checkout without installing
(as on a GPU machine that only has the tree on PYTHONPATH), they are found beside this folder instead.
"""

from pathlib import Path

_checkout = Path(__file__).resolve().parent.parent
if (_checkout / "setup.cfg").is_file() and (_checkout / "common" / "protocol.py").is_file():
    __path__.append(str(_checkout))
