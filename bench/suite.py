"""One `quiver bench` run from start to end.

1. Ask the server what it runs (GET /info) and check it is the checkpoint given by --model.
2. Cut the benchmark inputs from the standard library's text with the model's tokenizer.
3. The correctness gate: served embeddings (or scores) against a float32 transformers reference.
   Quiver failing it stops the run (exit status 1); a --compare server failing it is left out.
4. The chosen benchmarks against Quiver, the --compare servers, then the in-process baselines.
5. results.json, results.md and the plots under --out; the Markdown is also printed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import platform
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlparse

import torch

from quiver.bench.api import ServerApi, detect_api, get_json
from quiver.bench.benchmarks import BenchmarkRun, Progress, collapse
from quiver.bench.config import BenchConfig
from quiver.bench.corpus import SCORING_QUERY, TokenCorpus
from quiver.bench.gate import GateFailed, GateInputs, check_embeddings, check_scores
from quiver.bench.gate_outputs import check_m3_outputs
from quiver.bench.http_client import HttpSession, open_session
from quiver.bench.inprocess import (
    SentenceTransformersRunner, TransformersRunner, Unsupported, default_device, default_dtype,
)
from quiver.bench.report import markdown, write_json, write_plots
from quiver.bench.targets import HttpTarget, InProcessTarget, RequestFailed, Target
from quiver.bench.workloads import ServerFacts, Workloads, build_workloads
from quiver.common.model_info import KIND_CLASSIFIER, KIND_SPARSE, ModelError, ModelInfo, default_model_dir, load_model_info

GATE_TEXTS = 8
GATE_DOCUMENTS = 4


class SetupError(RuntimeError):
    """The run cannot start: the server is unreachable, or runs another model than --model."""


def run_suite(config: BenchConfig) -> int:
    """Exit status: 0 done, 1 the correctness gate failed, 2 the run could not start."""
    threads = torch.get_num_threads()
    if config.baseline_threads:
        torch.set_num_threads(config.baseline_threads)
    try:
        return asyncio.run(_run(config))
    except (SetupError, ModelError) as exc:
        print(f"quiver bench: {exc}", file=sys.stderr)
        return 2
    except GateFailed as exc:
        print(f"quiver bench: correctness gate FAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        torch.set_num_threads(threads)


async def _run(config: BenchConfig) -> int:
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    info = load_model_info(config.model or default_model_dir())
    device = config.baseline_device or default_device()
    dtype = config.baseline_dtype or default_dtype(device)
    connections = max(config.throughput_clients, config.bulk_clients, *config.concurrency_levels, 1) + 2
    sessions: list[HttpSession] = []

    def session_for(url: str) -> HttpSession:
        sessions.append(open_session(url, config.http_client, connections, config.timeout_s))
        return sessions[-1]

    try:
        session = session_for(config.url)
        server_info = await _server_info(session, config.url, config.wait_s, config.served_model)
        _check_same_model(server_info, info)
        facts = ServerFacts.from_info(server_info)
        corpus = TokenCorpus(info.tokenizer_path, prompt=info.prompts.get(info.default_prompt_name or "", ""))
        work = build_workloads(config, corpus, facts)
        results = _skeleton(config, server_info, work, device, dtype, session.name)
        sparse_dim = info.output_dim if info.kind == KIND_SPARSE else 0
        quiver = HttpTarget("quiver", config.url, session, ServerApi(config.api, config.served_model, sparse_dim))
        servers: list[HttpTarget] = [quiver]
        for index, spec in enumerate(config.compare):
            name, url = _compare_name_url(spec, index)
            target_session = session_for(url)
            try:
                api = dataclasses.replace(await detect_api(target_session, config.compare_api, config.compare_model),
                                          sparse_dim=sparse_dim)
            except RuntimeError as exc:
                raise SetupError(f"--compare {url}: {exc}") from exc
            servers.append(HttpTarget(name, url, target_session, api))
        for target in servers:
            results["targets"][target.name] = {"kind": "server", "detail": f"{target.url}, {target.api.flavour} API"}

        gate_inputs = _gate_inputs(corpus, work, facts, config)
        passing = await _gate_all(servers, info, gate_inputs, config, device, results, out)

        progress = _progress_factory(config.progress)
        for target in passing:
            await _run_benchmarks(target, work, config, progress, results)
        for name in config.baselines:
            await _run_baseline(name, info, device, dtype, work, config, progress, results)
    finally:
        for open_one in sessions:
            await open_one.close()
    text = _write_outputs(results, out)
    print(text)
    return 0


async def _server_info(session: HttpSession, url: str, wait_s: float, served_model: str = "") -> dict[str, Any]:
    """GET /info (of `served_model`, when named) once GET /health answers 200 (waiting up to wait_s for it)."""
    deadline = time.monotonic() + wait_s
    last = "no answer"
    while True:
        try:
            status, body = await session.request("GET", "/health")
            if status == 200:
                break
            last = f"status {status}: {body[:200].decode(errors='replace')}"
        except Exception as exc:  # noqa: BLE001 - any transport failure: not up yet
            last = f"{type(exc).__name__}: {exc}"
        if time.monotonic() >= deadline:
            raise SetupError(f"the server at {url} is not healthy ({last}); start it, or give --wait-s")
        await asyncio.sleep(0.5)
    server_info = await get_json(session, f"/info?model={quote(served_model)}" if served_model else "/info")
    if not isinstance(server_info, dict) or "max_input_length" not in server_info:
        raise SetupError(f"GET {url}/info did not describe the model; is this a Quiver server?")
    return server_info


def _check_same_model(server_info: dict[str, Any], info: ModelInfo) -> None:
    served = (server_info.get("model_kind"), server_info.get("dimensions"))
    if served != (info.kind, info.output_dim):
        raise SetupError(
            f"the server runs {server_info.get('model_id')} ({served[0]}, {served[1]} dimensions) but --model "
            f"{info.path} is a {info.kind} model with {info.output_dim}; point --model at the checkpoint it serves"
        )


def _compare_name_url(spec: str, index: int) -> tuple[str, str]:
    name, _, url = spec.partition("=") if "=" in spec.split("://")[0] else ("", "", spec)
    return name or urlparse(url).netloc or f"compare-{index + 1}", url


def _gate_inputs(corpus: TokenCorpus, work: Workloads, facts: ServerFacts, config: BenchConfig) -> GateInputs:
    """A few texts, one token-id input per length that will be timed, and documents for scorers."""
    lengths = sorted({*work.latency, *work.throughput, *([config.concurrency_length] if work.concurrency else [])})
    texts = corpus.mixed_texts(GATE_TEXTS, 8, min(256, facts.max_input_length), seed=1)
    documents: tuple[str, ...] = ()
    if work.scoring:
        documents = tuple(work.scoring[max(work.scoring)][0][:GATE_DOCUMENTS])
    return GateInputs(texts, [corpus.id_batch(length, 1) for length in lengths], SCORING_QUERY, documents)


async def _gate_all(servers: list[HttpTarget], info: ModelInfo, inputs: GateInputs, config: BenchConfig,
                    device: str, results: dict[str, Any], out: Path) -> list[HttpTarget]:
    """Gate every server; Quiver (the first) failing raises GateFailed, after writing the results so far."""
    if info.kind == KIND_CLASSIFIER and not inputs.documents:
        results["gate"] = {s.name: {"message": "not checked: no scoring benchmark runs"} for s in servers}
        return servers
    try:
        reference = TransformersRunner(info, device, "float32")
    except Unsupported as exc:
        message = f"not checked: {exc}"
        results["gate"] = {s.name: {"message": message} for s in servers}
        print(f"quiver bench: WARNING: correctness gate {message}", file=sys.stderr)
        return servers
    passing = []
    try:
        for target in servers:
            try:
                if info.kind != KIND_CLASSIFIER:
                    verdict = await check_embeddings(target, reference, inputs, config.min_cosine)
                    if info.m3_heads and target is servers[0]:
                        verdict["outputs"] = await check_m3_outputs(target, reference, inputs.texts,
                                                                    config.min_cosine)
                else:
                    verdict = await check_scores(target, reference, inputs, config.max_score_error)
            except GateFailed as exc:
                results["gate"][target.name] = exc.verdict
                if target is servers[0]:
                    _write_outputs(results, out)
                    raise
                print(f"quiver bench: {target.name} left out: {exc}", file=sys.stderr)
                continue
            except RequestFailed as exc:
                if target is servers[0]:
                    raise SetupError(f"the correctness gate's request failed: {exc}") from exc
                results["gate"][target.name] = {"passed": False, "message": str(exc)}
                print(f"quiver bench: {target.name} left out: {exc}", file=sys.stderr)
                continue
            results["gate"][target.name] = verdict
            passing.append(target)
    finally:
        reference.close()
    return passing


async def _run_benchmarks(target: Target, work: Workloads, config: BenchConfig, progress: Any,
                          results: dict[str, Any]) -> None:
    run = BenchmarkRun(target, work, config, progress, _report_line)
    for name in config.benchmarks:
        entries = await getattr(run, name)()
        if entries:
            results["benchmarks"][name]["results"][target.name] = collapse(entries)


async def _run_baseline(name: str, info: ModelInfo, device: str, dtype: str, work: Workloads, config: BenchConfig,
                        progress: Any, results: dict[str, Any]) -> None:
    runner_type = {"transformers": TransformersRunner, "sentence-transformers": SentenceTransformersRunner}[name]
    try:
        runner = runner_type(info, device, dtype)
    except Exception as exc:  # noqa: BLE001 - Unsupported, or a checkpoint the library cannot load
        results["targets"][name] = {"kind": "in-process", "detail": f"not run: {type(exc).__name__}: {exc}"}
        _report_line(f"{name}: not run: {exc}")
        return
    results["targets"][name] = {"kind": "in-process", "detail": f"{device}, {dtype}, one caller"}
    target = InProcessTarget(name, runner)
    try:
        await _run_benchmarks(target, work, config, progress, results)
    finally:
        target.close()


def _report_line(line: str) -> None:
    from tqdm import tqdm

    tqdm.write(line)


def _progress_factory(enabled: bool) -> Any:
    from tqdm import tqdm

    def make(description: str, total: int) -> Progress:
        # disable=None: bars only on a terminal, so logs stay readable
        return tqdm(total=total, desc=description, unit="req", leave=False, dynamic_ncols=True,
                    disable=None if enabled else True)

    return make


def _skeleton(config: BenchConfig, server_info: dict[str, Any], work: Workloads, device: str, dtype: str,
              http_client: str) -> dict[str, Any]:
    """The results document with every benchmark's settings and notes, before any figure."""
    import transformers

    chosen = set(config.benchmarks)

    def section(name: str, **settings: Any) -> dict[str, Any]:
        notes = work.notes.get(name, []) if name in chosen else ["not selected (--benchmarks)"]
        return {**settings, "notes": notes, "results": {}}

    devices = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    return {
        "meta": {
            "label": config.label, "date": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
            "quick": config.quick, "http_client": http_client, "baseline_device": device, "baseline_dtype": dtype,
            "devices": devices, "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers.__version__, "host": platform.node(),
            "config": dataclasses.asdict(config),
        },
        "server": server_info,
        "targets": {},
        "gate": {},
        "benchmarks": {
            "latency": section("latency", unit="ms", lengths=sorted(work.latency)),
            "scoring": section("scoring", unit="ms", documents=sorted(work.scoring), length=config.scoring_length),
            "throughput": section("throughput", unit="emb/s", clients=config.throughput_clients,
                                  batch=config.throughput_batch, lengths=sorted(work.throughput)),
            "concurrency": section("concurrency", unit="ms", levels=list(config.concurrency_levels),
                                   length=config.concurrency_length),
            "bulk": section("bulk", unit="emb/s", texts=sum(map(len, work.bulk)), tokens=sum(work.bulk_tokens),
                            batch=config.bulk_batch, clients=config.bulk_clients),
        },
    }


def _write_outputs(results: dict[str, Any], out: Path) -> str:
    write_json(results, out / "results.json")
    text = markdown(results)
    (out / "results.md").write_text(text, encoding="utf-8")
    write_plots(results, out)
    return text
