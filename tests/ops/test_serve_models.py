"""`quiver serve` with several models, planned without starting anything: the --config file, repeated
--model, each model's workers with their own options and GPU memory shares, the frontend's models file."""

from __future__ import annotations

from pathlib import Path

import pytest

from quiver.cli import _config_presets, build_parser
from quiver.common.config import FrontendSettings, ServeSettings, WorkerSettings, from_namespace
from quiver.common.models_file import ModelEntry, ModelsFileError, load_models_file
from quiver.plan import EXIT_USAGE, ServeError, plan_children, serve_models
from tests.ops.test_cli import clear_quiver_environment

CONFIG = """
[serve]
port = 8123
cuda_graphs = false

[[models]]
model = "/m/embedder"
served_model_name = "mini,embedder"
device = "cuda:0"
gpu_memory_fraction = 0.3

[[models]]
model = "/m/reranker"
served_model_name = "rerank"
device = "cuda:0,1"
dtype = "float16"
max_batch_tokens = 4096
"""


def serve_plan(tmp_path: Path, *argv: str, gpus: int = 2) -> tuple[ServeSettings, dict[str, list]]:
    args = build_parser().parse_args(["serve", "--broker-metrics-port", "0", "--worker-metrics-port", "0", *argv])
    cli_models = args.model or []
    args.model = cli_models[0] if len(cli_models) == 1 else None
    presets, config_models = _config_presets(args.config) if args.config else ({}, [])
    settings = from_namespace(ServeSettings, args, presets)
    models = serve_models(settings, cli_models, config_models)
    by_role: dict[str, list] = {}
    for child in plan_children(settings, Path(models[0].model), tmp_path, gpus, models):
        by_role.setdefault(child.role, []).append(child)
    return settings, by_role


def child_settings(settings_type: type, child) -> object:
    return from_namespace(settings_type, build_parser().parse_args(child.argv[3:]))


def test_a_config_file_gives_each_model_its_workers_options_and_names(monkeypatch, tmp_path):
    clear_quiver_environment(monkeypatch)
    config = tmp_path / "quiver.toml"
    config.write_text(CONFIG)
    settings, children = serve_plan(tmp_path, "--config", str(config), "--port", "9000")
    assert settings.port == 9000 and settings.cuda_graphs is False  # the command line wins over [serve]
    workers = [child_settings(WorkerSettings, child) for child in children["worker"]]
    assert [(w.name, w.model, w.device, w.model_name) for w in workers] == [
        ("mini-cuda:0", "/m/embedder", "cuda:0", "mini"),
        ("rerank-cuda:0", "/m/reranker", "cuda:0", "rerank"),
        ("rerank-cuda:1", "/m/reranker", "cuda:1", "rerank"),
    ]
    # cuda:0 is shared: the embedder takes what it asks, the reranker's worker the rest of the default share
    assert [w.gpu_memory_fraction for w in workers] == [0.3, 0.6, 0.0]
    assert [w.dtype for w in workers] == ["", "float16", "float16"]
    assert [w.max_batch_tokens for w in workers] == [0, 4096, 4096]
    assert all(w.cuda_graphs is False for w in workers)
    frontend = child_settings(FrontendSettings, children["frontend"][0])
    assert frontend.models_file == str(tmp_path / "models.toml")
    written = load_models_file(frontend.models_file).models
    assert [(m.model, m.names()) for m in written] == [("/m/embedder", ["mini", "embedder"]),
                                                       ("/m/reranker", ["rerank"])]
    assert len(children["broker"]) == 1


def test_repeated_model_options_start_workers_of_each_on_the_cpu(monkeypatch, tmp_path):
    clear_quiver_environment(monkeypatch)
    _, children = serve_plan(tmp_path, "--model", "/m/a", "--model", "/m/b", "--workers", "2", gpus=0)
    names = [child_settings(WorkerSettings, child).name for child in children["worker"]]
    assert names == ["a-cpu-0", "a-cpu-1", "b-cpu-2", "b-cpu-3"]
    frontend = child_settings(FrontendSettings, children["frontend"][0])
    assert [m.model for m in load_models_file(frontend.models_file).models] == ["/m/a", "/m/b"]


def test_one_model_plans_as_before(monkeypatch, tmp_path):
    clear_quiver_environment(monkeypatch)
    _, children = serve_plan(tmp_path, "--model", "/m/a", "--served-model-name", "x,y", gpus=0)
    frontend = child_settings(FrontendSettings, children["frontend"][0])
    assert frontend.models_file == "" and frontend.model == "/m/a" and frontend.served_model_name == "x,y"
    assert [child_settings(WorkerSettings, c).name for c in children["worker"]] == ["cpu-0"]
    assert not (tmp_path / "models.toml").exists()


@pytest.mark.parametrize("argv, words", [
    (("--model", "/m/a", "--model", "/m/b", "--served-model-name", "x"), "--served-model-name names one model"),
])
def test_ambiguous_options_are_refused(monkeypatch, tmp_path, argv, words):
    clear_quiver_environment(monkeypatch)
    with pytest.raises(ServeError, match=words) as caught:
        serve_plan(tmp_path, *argv, gpus=0)
    assert caught.value.exit_code == EXIT_USAGE


def test_models_from_both_the_command_line_and_the_file_are_refused(monkeypatch, tmp_path):
    clear_quiver_environment(monkeypatch)
    config = tmp_path / "quiver.toml"
    config.write_text(CONFIG)
    with pytest.raises(ServeError, match="not both"):
        serve_plan(tmp_path, "--config", str(config), "--model", "/m/c")


def test_workers_sharing_a_gpu_may_not_ask_for_more_than_all_of_it(monkeypatch, tmp_path):
    clear_quiver_environment(monkeypatch)
    config = tmp_path / "quiver.toml"
    config.write_text('[[models]]\nmodel = "/m/a"\ndevice = "cuda:0"\ngpu_memory_fraction = 0.7\n\n'
                      '[[models]]\nmodel = "/m/b"\ndevice = "cuda:0"\ngpu_memory_fraction = 0.5\n')
    with pytest.raises(ServeError, match="cuda:0 ask for 1.2"):
        serve_plan(tmp_path, "--config", str(config), gpus=1)


@pytest.mark.parametrize("text, words", [
    ("[[models]]\nserved_model_name = 'x'\n", "needs model"),
    ("[[models]]\nmodel = '/m/a'\ncolour = 'red'\n", "unknown keys ['colour']"),
    ("[[models]]\nmodel = '/m/a'\nworkers = 'two'\n", "workers must be of type int"),
    ("[[models]]\nmodel = '/m/a'\ngpu_memory_fraction = 1.5\n", "gpu_memory_fraction must lie in"),
    ("[[models]]\nmodel = '/m/a'\nserved_model_name = 'x'\n[[models]]\nmodel = '/m/b'\nserved_model_name = 'x'\n",
     "the name 'x' is given to both"),
    ("[serve]\nport = 1\n", "names no model"),
    ("[servers]\n", "unknown top-level keys"),
    ("model = [", "is not TOML"),
])
def test_a_malformed_models_file_says_what_is_wrong(tmp_path, text, words):
    path = tmp_path / "models.toml"
    path.write_text(text)
    with pytest.raises(ModelsFileError, match=words.replace("[", r"\[").replace("]", r"\]")):
        load_models_file(path)


def test_an_unknown_serve_option_in_the_file_is_refused(tmp_path):
    path = tmp_path / "quiver.toml"
    path.write_text("[serve]\nportt = 1\n[[models]]\nmodel = '/m/a'\n")
    with pytest.raises(ModelsFileError, match="no option 'portt'"):
        _config_presets(str(path))


def test_an_entry_lists_its_names():
    assert ModelEntry("/m/a", " a, b ,").names() == ["a", "b"]
