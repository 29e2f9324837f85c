"""What `make serve`, `make test` and the Dockerfile install and run, read from make's own dry run
(`make -n`) and from the Dockerfile's instructions. The image is not built here (no container engine
in CI); this checks that it installs what `make serve` installs."""

from __future__ import annotations

import configparser
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make is not installed")


def dry_run(target: str, tmp_path: Path) -> list[str]:
    """The commands `make TARGET` would run on a fresh clone (a virtual environment not made yet)."""
    out = subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={tmp_path / 'venv'}"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if line.strip() and not line.startswith("make")]


def pip_installs(commands: list[str]) -> list[list[str]]:
    """The arguments of every `pip install` among the commands (the part before a `||` fallback)."""
    found = []
    for command in commands:
        for part in command.split("||")[:1]:
            words = shlex.split(part)
            if "pip" in words and "install" in words:
                found.append(words[words.index("install") + 1:])
    return found


def test_make_serve_installs_only_what_serving_needs_and_shows_progress(tmp_path):
    commands = dry_run("serve", tmp_path)
    installs = pip_installs(commands)
    assert installs, commands
    for args in installs:
        assert "-q" not in args and "--quiet" not in args
        assert not any("[test]" in arg or "bench" in arg for arg in args), args
    assert any(args == ["-e", "."] for args in installs), installs
    assert any("/health answers 200 (about" in line for line in commands), "says how long the first start takes"
    assert commands[-1].split()[-2:] == ["quiver", "serve"] or "quiver serve" in commands[-1]


def test_make_test_adds_the_test_extra_and_lints_before_pytest(tmp_path):
    commands = dry_run("test", tmp_path)
    installs = pip_installs(commands)
    assert any("-e" in args and ".[test]" in args and "./bench" in args for args in installs), installs
    steps = [line for line in commands if not line.startswith("echo ")]
    order = [next(i for i, line in enumerate(steps) if pattern in line)
             for pattern in ("ops/ci/install-tools.sh", "/bin/ruff check", "/bin/mypy", "-m pytest")]
    assert order == sorted(order), commands
    extras = configparser.ConfigParser()
    extras.read(ROOT / "setup.cfg")
    test_extra = extras["options.extras_require"]["test"]
    assert re.search(r"^ruff==", test_extra, re.M) and re.search(r"^mypy==", test_extra, re.M)


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per instruction, continuation lines joined, comments dropped."""
    text = (ROOT / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if not line.lstrip().startswith("#")]
    joined = re.sub(r"\\\n\s*", " ", "\n".join(lines))
    instructions = []
    for line in joined.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            instructions.append((keyword, rest.strip()))
    return instructions


def test_the_dockerfile_parses_and_installs_what_make_serve_does(tmp_path):
    known = {"ARG", "FROM", "ENV", "RUN", "COPY", "USER", "WORKDIR", "EXPOSE", "ENTRYPOINT", "CMD", "LABEL"}
    instructions = dockerfile_instructions()
    assert all(keyword in known for keyword, _ in instructions), instructions
    keywords = [keyword for keyword, _ in instructions]
    assert keywords.index("FROM") < keywords.index("RUN")
    args = dict(rest.split("=", 1) for keyword, rest in instructions if keyword == "ARG")
    assert args["CUDA_IMAGE"].startswith("nvidia/cuda:")

    makefile_torch = re.search(r"^TORCH \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert makefile_torch is not None and args["TORCH"] == makefile_torch.group(1)

    runs = [rest for keyword, rest in instructions if keyword == "RUN"]
    image_installs = pip_installs([part for run in runs for part in run.split("&&")])
    make_installs = pip_installs(dry_run("serve", tmp_path))
    assert ["--no-cache-dir", "/src/quiver"] in image_installs, image_installs
    assert any("${TORCH}" in args for args in image_installs)
    assert not any("[" in arg for args in image_installs for arg in args), "the image installs no extras"
    assert sum(1 for args in make_installs if args == ["-e", "."]) == 1
    copies = [rest for keyword, rest in instructions if keyword == "COPY"]
    assert copies == [". /src/quiver"]
    entry = next(rest for keyword, rest in instructions if keyword == "ENTRYPOINT")
    assert entry.startswith('["quiver", "serve"')
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored
