"""The graph-node probe on a GPU: a known graph's nodes, and a whole engine step's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from quiver.bench.engine import graph_nodes

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_a_graph_of_three_adds_has_three_kernel_nodes() -> None:
    x = torch.zeros(1024, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        x.add_(1)
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(graph, stream=stream):
            for _ in range(3):
                x.add_(1)
        graph.instantiate()
    summary = graph_nodes.node_summary(graph)
    assert dict(summary.types) == {"kernel": 3} and summary.count == 3
    (name, count), = summary.kernels.items()
    assert count == 3 and "elementwise" in name
    times = graph_nodes.launch_times(graph, samples=5)
    assert times["single_ms"] > 0 and times["back_to_back_ms"] > 0 and times["replay_cpu_ms"] > 0
    assert x[0].item() == 1 + 3 * (5 + 20)  # the eager add, then 3 adds a replay: 5 samples and 20 back to back


def test_an_engine_step_is_one_graph_of_its_layers_kernels(tmp_path: Path) -> None:
    from quiver.worker.engine import load_engine
    from tests.worker.engine.families import FAMILIES, write_family

    family = next(f for f in FAMILIES if f.name == "bert_mean")
    path, model = write_family(family, tmp_path)
    row = graph_nodes.probe_step(load_engine(path, device="cuda"), 64)
    layers = model.config.num_hidden_layers
    assert row["types"]["kernel"] >= 4 * layers and row["nodes"] >= row["types"]["kernel"]
    assert 0 < row["back_to_back_ms"] and 0 < row["single_ms"]
