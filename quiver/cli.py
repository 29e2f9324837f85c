"""The `quiver` command: `serve` runs everything on one host; `broker`, `frontend` and `worker` run one
role each (for systemd). Every option can also come from a QUIVER_* environment variable."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from importlib.metadata import entry_points
from pathlib import Path
from typing import Callable

from quiver.common.config import (
    SERVE_HIDDEN, BrokerSettings, FrontendSettings, ServeSettings, WorkerSettings, add_arguments, env_name,
    from_namespace, parse_value,
)
from quiver.common.logs import setup_logging
from quiver.common.model_info import EXIT_MODEL_ERROR
from quiver.common.version import __version__


def _broker(args: argparse.Namespace) -> int:
    from quiver.broker.main import run_broker

    settings = from_namespace(BrokerSettings, args)
    setup_logging(settings.log_level, "broker")
    return run_broker(settings)


def _with_model_dir(settings: WorkerSettings | FrontendSettings) -> bool:
    """Resolve --model (a directory, or a hub id in the local Hugging Face cache) in place; False,
    after logging why, when it names nothing usable."""
    from quiver.common.model_info import ModelError, resolve_model_dir

    if not settings.model:
        return True
    try:
        settings.model = str(resolve_model_dir(settings.model))
    except ModelError as exc:
        logging.getLogger("quiver").error("cannot load the model: %s", exc)
        return False
    return True


def _worker(args: argparse.Namespace) -> int:
    from quiver.worker.main import run_worker

    settings = from_namespace(WorkerSettings, args)
    setup_logging(settings.log_level, f"worker:{settings.name or settings.device}")
    return run_worker(settings) if _with_model_dir(settings) else EXIT_MODEL_ERROR


def _frontend(args: argparse.Namespace) -> int:
    from quiver.frontend.server import run_frontend

    settings = from_namespace(FrontendSettings, args)
    setup_logging(settings.log_level, "frontend")
    return run_frontend(settings) if _with_model_dir(settings) else EXIT_MODEL_ERROR


def _keys(args: argparse.Namespace) -> int:
    from quiver.common.security import make_keys

    directory = Path(args.dir)
    existing = [p for p in (directory / f"{args.name}.key", directory / f"{args.name}.key_secret") if p.exists()]
    if existing and not args.force:
        print(f"quiver keys: {', '.join(map(str, existing))} exists already; pass --force to replace the key pair "
              f"(peers holding the old public key will be refused)", file=sys.stderr)
        return 1
    if not directory.is_dir():
        print(f"creating the directory {directory}")
    public, secret = make_keys(directory, args.name)
    print(f"public key (give it to peers): {public}\nsecret key (keep it here):     {secret}")
    return 0


def _config_presets(path: str) -> tuple[dict[str, object], list]:
    """A --config file's [serve] options (as ServeSettings values) and its [[models]]."""
    from typing import get_type_hints

    from quiver.common.models_file import ModelsFileError, load_models_file

    document = load_models_file(path)
    hints = get_type_hints(ServeSettings)
    offered = {f for f in hints if f not in SERVE_HIDDEN | {"model", "config"}}
    presets: dict[str, object] = {}
    for key, value in document.serve.items():
        if key not in offered:
            raise ModelsFileError(f"{path}: [serve] has no option {key!r}")
        try:
            presets[key] = parse_value(hints[key], str(value).lower() if isinstance(value, bool) else str(value))
        except ValueError as exc:
            raise ModelsFileError(f"{path}: [serve] {key} = {value!r}: {exc}") from exc
    return presets, document.models


def _serve(args: argparse.Namespace) -> int:
    """Options on the command line (or QUIVER_*) win over the --config file's [serve], which win over
    the defaults; models come from --model (repeatable) or the file's [[models]]."""
    from quiver.common.model_info import ModelError
    from quiver.plan import ServeError, serve_models
    from quiver.supervisor import Supervisor

    cli_models: list[str] = args.model or ([os.environ[env_name("model")]] if os.environ.get(env_name("model")) else [])
    args.model = cli_models[0] if len(cli_models) == 1 else None
    try:
        presets, config_models = _config_presets(args.config) if args.config else ({}, [])
        settings = from_namespace(ServeSettings, args, presets)
        setup_logging(settings.log_level, "serve")
        models = serve_models(settings, cli_models, config_models)
    except ModelError as exc:
        setup_logging("info", "serve")
        logging.getLogger("quiver.serve").error("cannot serve: %s", exc)
        return EXIT_MODEL_ERROR
    except ServeError as exc:
        setup_logging("info", "serve")
        logging.getLogger("quiver.serve").error("cannot serve: %s", exc)
        return exc.exit_code
    return Supervisor(settings, models).run()


COMMANDS_GROUP = "quiver.commands"  # entry points that add a subcommand: fn(subparsers)

ROLES: dict[str, tuple[type, Callable[[argparse.Namespace], int], str, frozenset[str]]] = {
    "serve": (ServeSettings, _serve, "start broker, workers and frontend on this host and supervise them",
              SERVE_HIDDEN),
    "broker": (BrokerSettings, _broker, "run the broker that spreads chunks over workers", frozenset()),
    "frontend": (FrontendSettings, _frontend, "run the HTTP frontend", frozenset()),
    "worker": (WorkerSettings, _worker, "run one worker on one device", frozenset()),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="quiver", description=__doc__)
    parser.add_argument("--version", action="version", version=f"quiver {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (settings_type, _, help_text, exclude) in ROLES.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if name == "serve":
            sub.add_argument("--model", action="append", metavar="MODEL",
                             help="checkpoint directory or hub id; repeat it to serve several models, each under "
                                  "its own name [env QUIVER_MODEL (one); default: the packaged all-MiniLM-L6-v2]")
            exclude = exclude | {"model"}
        add_arguments(sub, settings_type, exclude)
    keys = commands.add_parser("keys", help="make a CurveZMQ key pair for links between hosts",
                               description="Write NAME.key (public) and NAME.key_secret (secret) into DIR.")
    keys.add_argument("--dir", default=".", help="directory to write the key files into")
    keys.add_argument("--name", required=True, help="the key pair's name, e.g. broker or worker-gpu3")
    keys.add_argument("--force", action="store_true", help="replace an existing key pair of that name")
    keys.set_defaults(run=_keys)
    for command in entry_points(group=COMMANDS_GROUP):  # e.g. `bench`, from the quiver-bench distribution
        command.load()(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in ROLES:
        return ROLES[args.command][1](args)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
