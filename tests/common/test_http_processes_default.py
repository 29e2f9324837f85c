"""`quiver serve` sizes its frontend's HTTP processes by the GPUs it serves, within the cores."""

from __future__ import annotations

import os
from pathlib import Path

from quiver.cli import build_parser
from quiver.common.config import ServeSettings, default_http_processes, from_namespace
from quiver.common.model_info import default_model_dir
from quiver.plan import plan_children


def test_one_http_process_per_gpu_within_the_cores_left_by_workers_and_broker():
    assert default_http_processes(gpus=0, cpus=2) == 1
    assert default_http_processes(gpus=1, cpus=16) == 1
    assert default_http_processes(gpus=2, cpus=16) == 2
    assert default_http_processes(gpus=8, cpus=128) == 8
    assert default_http_processes(gpus=8, cpus=12) == 3  # 8 workers and the broker leave 3 cores
    assert default_http_processes(gpus=8, cpus=8) == 1


def planned_http_processes(argv: list[str], gpus: int, tmp_path: Path) -> str:
    settings = from_namespace(ServeSettings, build_parser().parse_args(["serve", *argv]))
    children = plan_children(settings, default_model_dir(), tmp_path, gpus)
    frontend_argv = next(child.argv for child in children if child.role == "frontend")
    return frontend_argv[frontend_argv.index("--http-processes") + 1]


def test_serve_on_cpus_starts_one_http_process_unless_told_otherwise(tmp_path: Path):
    assert planned_http_processes(["--device", "cpu"], 0, tmp_path) == "1"
    assert planned_http_processes(["--device", "cpu", "--http-processes", "3"], 0, tmp_path) == "3"


def test_serve_on_gpus_starts_one_http_process_per_gpu_within_the_cores(tmp_path: Path):
    expected = default_http_processes(gpus=2, cpus=os.cpu_count() or 1)
    assert planned_http_processes(["--device", "cuda:0,1"], 2, tmp_path) == str(expected)
