"""The run's figures as results.json, a Markdown report and PNG plots (matplotlib, no display needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LATENCY_CELL = ("p50", "p90", "p99", "max")


def write_json(results: dict[str, Any], path: Path) -> None:
    path.write_text(json.dumps(results, indent=1, sort_keys=False) + "\n", encoding="utf-8")


def _cell(entry: Any, keys: tuple[str, ...]) -> str:
    if not isinstance(entry, dict):
        return "–"
    if "error" in entry:
        return "error"
    if "skipped" in entry:
        return "skipped"
    return " / ".join(_number(entry[key]) if key in entry else "–" for key in keys)


def _number(value: float) -> str:
    if isinstance(value, int) or abs(value) >= 10_000:
        return f"{value:.0f}"
    return f"{value:.4g}"


def _settings(section: dict[str, Any]) -> list[str]:
    """Every setting any target measured, in numeric order."""
    found = {setting for entries in section["results"].values() if "skipped" not in entries for setting in entries}
    return sorted(found, key=lambda s: (not s.isdigit(), int(s) if s.isdigit() else 0, s))


def _table(section: dict[str, Any], heading: str, column: str, keys: tuple[str, ...]) -> list[str]:
    settings = _settings(section)
    lines = [f"## {heading}", ""]
    if settings:
        lines += ["| target | " + " | ".join(column.format(s) for s in settings) + " |",
                  "| --- |" + " --- |" * len(settings)]
        for target, entries in section["results"].items():
            if "skipped" in entries:
                continue
            lines.append(f"| {target} | " + " | ".join(_cell(entries.get(s), keys) for s in settings) + " |")
        lines.append("")
    lines += _notes(section)
    return lines


def _notes(section: dict[str, Any]) -> list[str]:
    notes = list(section.get("notes", []))
    for target, entries in section["results"].items():
        if "skipped" in entries:
            notes.append(f"{target}: {entries['skipped']}")
            continue
        for setting, entry in entries.items():
            for kind in ("skipped", "error"):
                if isinstance(entry, dict) and kind in entry:
                    notes.append(f"{target}, {setting}: {kind}: {entry[kind]}")
    return [f"- {note}" for note in notes] + ([""] if notes else [])


def markdown(results: dict[str, Any]) -> str:
    meta = results["meta"]
    lines = [f"# Quiver benchmark{' — ' + meta['label'] if meta.get('label') else ''}", ""]
    lines.append(f"{meta['date']}; model {results['server'].get('model_id')} "
                 f"({results['server'].get('model_kind')}, max {results['server'].get('max_input_length')} tokens); "
                 f"baselines on {meta['baseline_device']} ({meta['baseline_dtype']}); "
                 f"devices: {', '.join(meta['devices']) or 'cpu'}; HTTP client {meta['http_client']}"
                 f"{'; quick run (smoke test, not figures to quote)' if meta['quick'] else ''}.")
    lines += ["", "| target | what | how |", "| --- | --- | --- |"]
    for name, target in results["targets"].items():
        lines.append(f"| {name} | {target['kind']} | {target['detail']} |")
    lines += ["", "Correctness gate against a float32 transformers reference, before any timing:", ""]
    for name, verdict in results["gate"].items():
        if verdict.get("kind") == "embeddings":
            lines.append(f"- {name}: min cosine {verdict['min_cosine']} over {verdict['inputs']} inputs "
                         f"(threshold {verdict['threshold']}): {'passed' if verdict['passed'] else 'FAILED'}")
            outputs = verdict.get("outputs", {})
            if "sparse" in outputs:
                sparse, colbert = outputs["sparse"], outputs["colbert"]
                lines.append(f"  - sparse: min cosine {sparse['min_cosine']}, largest weight difference "
                             f"{sparse['max_error']}; ColBERT: min mean cosine {colbert['min_mean_cosine']} "
                             f"(worst token {colbert['min_token_cosine']}): passed")
            elif outputs:
                lines.append(f"  - sparse and ColBERT: {outputs.get('message')}")
        elif verdict.get("kind") == "scores":
            lines.append(f"- {name}: max score difference {verdict['max_error']} over {verdict['inputs']} documents "
                         f"(threshold {verdict['threshold']}): {'passed' if verdict['passed'] else 'FAILED'}")
        else:
            lines.append(f"- {name}: {verdict.get('message', verdict)}")
    lines.append("")
    b = results["benchmarks"]
    lines += _table(b["latency"], "Batch-1 latency, token ids, sequential (ms: p50 / p90 / p99 / max)",
                    "{} tok", LATENCY_CELL)
    lines += _table(b["scoring"], f"Scoring latency, one query, documents of {b['scoring'].get('length')} tokens "
                                  "(ms: p50 / p90 / p99 / max)", "{} docs", LATENCY_CELL)
    lines += _table(b["throughput"], f"Throughput, {b['throughput'].get('clients')} clients x batches of "
                                     f"{b['throughput'].get('batch')} token-id sequences (emb/s)", "{} tok", ("emb_per_s",))
    lines += _table(b["concurrency"], f"Concurrency, single texts of {b['concurrency'].get('length')} tokens, "
                                      "tokenization included (ms: first run p50 / p99, then warmed p50 / p99)",
                    "{} clients", ("first_p50", "first_p99", "p50", "p99"))
    corpus_size = f"{b['bulk']['texts']} " if b["bulk"].get("texts") else ""
    lines += _table(b["bulk"], f"Bulk, {corpus_size}texts of mixed lengths (texts / tokens / s / emb/s / tokens/s)", "{}",
                    ("texts", "tokens", "seconds", "emb_per_s", "tokens_per_s"))
    return "\n".join(lines).rstrip() + "\n"


def write_plots(results: dict[str, Any], out: Path) -> list[Path]:
    """latency_by_length.png, throughput_by_length.png, latency_by_concurrency.png and
    scoring_latency.png, each only when its benchmarks measured something."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    b = results["benchmarks"]
    title = results["meta"].get("label") or str(results["server"].get("model_id"))
    colors = {target: f"C{i}" for i, target in enumerate(results["targets"])}
    written = []
    plots = [
        ("latency_by_length.png", lambda ax: _latency_bars(ax, b["latency"], "tokens per input", colors)),
        ("throughput_by_length.png", lambda ax: _throughput_bars(ax, b["throughput"], b["bulk"], colors)),
        ("latency_by_concurrency.png", lambda ax: _concurrency_lines(ax, b["concurrency"], colors)),
        ("scoring_latency.png", lambda ax: _latency_bars(ax, b["scoring"], "documents per query", colors)),
    ]
    for name, draw in plots:
        fig, ax = plt.subplots(figsize=(8, 4.8))
        if draw(ax):
            ax.set_title(f"{title}: {name.removesuffix('.png').replace('_', ' ')}")
            fig.tight_layout()
            fig.savefig(out / name, dpi=110)
            written.append(out / name)
        plt.close(fig)
    return written


def _measured(section: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """target → {setting: entry} for the entries that hold figures."""
    return {
        target: {s: e for s, e in entries.items() if isinstance(e, dict) and "skipped" not in e and "error" not in e}
        for target, entries in section["results"].items() if "skipped" not in entries
    }


def _grouped_positions(count: int, targets: int) -> tuple[list[float], float]:
    width = 0.8 / max(targets, 1)
    return [i - 0.4 + width / 2 for i in range(count)], width


def _latency_bars(ax: Any, section: dict[str, Any], xlabel: str, colors: dict[str, str]) -> bool:
    """p50 bars, with a whisker up to p99, per setting and target (log scale: baselines are far slower)."""
    measured = {t: e for t, e in _measured(section).items() if e}
    settings = _settings(section)
    if not measured or not settings:
        return False
    base, width = _grouped_positions(len(settings), len(measured))
    for index, (target, entries) in enumerate(measured.items()):
        xs = [base[i] + index * width for i, s in enumerate(settings) if s in entries]
        p50 = [entries[s]["p50"] for s in settings if s in entries]
        p99 = [entries[s]["p99"] - entries[s]["p50"] for s in settings if s in entries]
        ax.bar(xs, p50, width, yerr=[[0] * len(p99), p99], capsize=3, color=colors.get(target),
               label=f"{target} (p50, whisker p99)")
    ax.set_xticks(range(len(settings)), settings)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("ms per request")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    return True


def _throughput_bars(ax: Any, throughput: dict[str, Any], bulk: dict[str, Any], colors: dict[str, str]) -> bool:
    groups: dict[str, dict[str, float]] = {}
    for target, entries in _measured(throughput).items():
        for setting, entry in entries.items():
            groups.setdefault(f"{entry['batch']}x{setting}", {})[target] = entry["emb_per_s"]
    for target, entries in _measured(bulk).items():
        for entry in entries.values():
            groups.setdefault("bulk (mixed)", {})[target] = entry["emb_per_s"]
    targets = [t for t in colors if any(t in values for values in groups.values())]
    if not groups:
        return False
    labels = list(groups)
    base, width = _grouped_positions(len(labels), len(targets))
    for index, target in enumerate(targets):
        xs = [base[i] + index * width for i, label in enumerate(labels) if target in groups[label]]
        ax.bar(xs, [groups[label][target] for label in labels if target in groups[label]], width,
               color=colors.get(target), label=target)
    ax.set_xticks(range(len(labels)), labels)
    ax.set_xlabel("sequences per request x tokens per sequence")
    ax.set_ylabel("embeddings per second")
    ax.legend(fontsize=8)
    return True


def _concurrency_lines(ax: Any, section: dict[str, Any], colors: dict[str, str]) -> bool:
    levels_seen: set[int] = set()
    for target, entries in _measured(section).items():
        levels = sorted(entries, key=int)
        if not levels:
            continue
        xs = [int(level) for level in levels]
        levels_seen.update(xs)
        color = colors.get(target)
        ax.plot(xs, [entries[level]["p50"] for level in levels], marker="o", color=color, label=f"{target} p50")
        ax.plot(xs, [entries[level]["p99"] for level in levels], marker="x", linestyle="--", color=color,
                label=f"{target} p99")
    if levels_seen:
        ax.set_xscale("log", base=2)
        ax.set_xticks(sorted(levels_seen), [str(level) for level in sorted(levels_seen)])
        ax.set_yscale("log")
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel("ms per request")
        ax.legend(fontsize=8)
    return bool(levels_seen)
