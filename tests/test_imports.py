"""The import contract of the stage folders: imports point down to quiver.common only, the frontend and
the broker never load torch, and only bench and the tests import quiver.bench.

Read two ways: every import statement in the source (including those inside functions), and the
modules a fresh interpreter has loaded after importing a role's entry modules with torch blocked.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("common", "broker", "worker", "frontend")
# The quiver packages each folder may import besides itself; quiver/ (the CLI, the supervisor) may import any.
ALLOWED = {
    "common": set(),
    "broker": {"quiver.common"},
    "worker": {"quiver.common"},
    "frontend": {"quiver.common"},
    "quiver": {"quiver.common", "quiver.broker", "quiver.worker", "quiver.frontend"},
}
# What each role's process imports first (quiver/cli.py's handlers); none of it may need torch.
TORCHLESS_ENTRIES = {
    "frontend": ["quiver.frontend.app", "quiver.frontend.server"],
    "broker": ["quiver.broker.main"],
}


def imported_modules(path: Path) -> set[str]:
    """Every module an `import` or `from ... import` in the file names, absolute."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                raise AssertionError(f"{path}: relative import; write `from quiver.<stage> import ...`")
            found.add(node.module or "")
    return found


def quiver_package(module: str) -> str | None:
    """quiver.common.protocol -> quiver.common; None for anything outside quiver.*."""
    parts = module.split(".")
    if parts[0] != "quiver" or len(parts) < 2:
        return None
    return ".".join(parts[:2])


def source_files(folder: str) -> list[Path]:
    files = sorted((ROOT / folder).rglob("*.py"))
    assert files, f"no sources under {folder}/"
    return files


@pytest.mark.parametrize("folder", [*STAGES, "quiver"])
def test_each_stage_imports_only_downwards(folder):
    if folder == "quiver":
        own = {f"quiver.{path.stem}" for path in source_files(folder)}
    else:
        own = {f"quiver.{folder}"}
    allowed = ALLOWED[folder] | own
    wrong = []
    for path in source_files(folder):
        for module in imported_modules(path):
            package = quiver_package(module)
            if package is not None and package not in allowed:
                wrong.append(f"{path.relative_to(ROOT)} imports {module}")
            if module.split(".")[0] in STAGES + ("bench",):
                wrong.append(f"{path.relative_to(ROOT)} imports {module} outside the quiver namespace")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("folder", ["common", "broker", "frontend"])
def test_torch_is_not_imported_by_torchless_stages(folder):
    wrong = [f"{path.relative_to(ROOT)} imports {module}" for path in source_files(folder)
             for module in imported_modules(path) if module.split(".")[0] == "torch"]
    assert not wrong, "\n".join(wrong)


def test_only_bench_and_tests_import_bench():
    wrong = [f"{path.relative_to(ROOT)} imports {module}" for folder in (*STAGES, "quiver")
             for path in source_files(folder) for module in imported_modules(path)
             if module == "quiver.bench" or module.startswith("quiver.bench.")]
    assert not wrong, "\n".join(wrong)


def loaded_without_torch(modules: list[str]) -> list[str]:
    """Import `modules` in a fresh interpreter where `import torch` fails; the quiver modules it loaded."""
    program = (
        "import json, sys\n"
        "sys.modules['torch'] = None  # any `import torch` now raises ImportError\n"
        f"for name in {modules!r}:\n"
        "    __import__(name)\n"
        "print(json.dumps(sorted(m for m in sys.modules if m == 'quiver' or m.startswith('quiver.'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("role", sorted(TORCHLESS_ENTRIES))
def test_role_starts_without_torch_and_loads_only_common(role):
    loaded = loaded_without_torch(TORCHLESS_ENTRIES[role])
    allowed = ("quiver.common", f"quiver.{role}")
    assert f"quiver.{role}" in loaded
    strays = [m for m in loaded if m != "quiver" and quiver_package(m) not in allowed]
    assert not strays, strays


def test_blocking_torch_is_seen():
    """The check above can fail: a module that needs torch does not import with it blocked."""
    program = "import sys\nsys.modules['torch'] = None\nimport quiver.worker.engine.models\n"
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd="/")
    assert out.returncode != 0 and "torch" in out.stderr
