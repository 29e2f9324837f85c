"""Shared test set-up: markers and the packaged default model."""

from __future__ import annotations

import importlib
import importlib.util
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

# The modules that define Triton kernels, which their CPU tests run under Triton's interpreter.
TRITON_KERNEL_MODULES = ("quiver.worker.engine.layers.triton_ops", "quiver.worker.engine.layers.triton_attention")


def _import_triton_kernels_interpreted() -> None:
    """Where Triton is installed but no GPU is, import the kernel modules once, here, with TRITON_INTERPRET=1:
    Triton reads it when a kernel is defined, so a module first imported by another test module (a benchmark's
    test, say) would otherwise hold compiled kernels that cannot run on CPU tensors. The variable is restored
    afterwards, so that the servers the tests start do not inherit it."""
    if importlib.util.find_spec("triton") is None or _cuda_available():
        return
    previous = os.environ.get("TRITON_INTERPRET")
    os.environ["TRITON_INTERPRET"] = "1"
    try:
        for module in TRITON_KERNEL_MODULES:
            importlib.import_module(module)
    finally:
        if previous is None:
            del os.environ["TRITON_INTERPRET"]
        else:
            os.environ["TRITON_INTERPRET"] = previous


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


_import_triton_kernels_interpreted()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


@pytest.fixture(scope="session")
def cluster():
    """One broker, two CPU workers and a frontend on the packaged model, shared by the session's tests."""
    from tests.cluster import Cluster, free_port

    broker_metrics = free_port()
    instance = Cluster(workers=2, broker_args=["--metrics-port", str(broker_metrics)],
                       frontend_args=["--max-body-bytes", str(4 * 1024 * 1024)])
    instance.broker_metrics_url = f"http://127.0.0.1:{broker_metrics}/metrics"
    instance.start()
    yield instance
    instance.stop()


@pytest.fixture(scope="session")
def st_model():
    """sentence-transformers' own encoder of the packaged model: the numerical reference."""
    from sentence_transformers import SentenceTransformer

    from quiver.common.model_info import default_model_dir

    return SentenceTransformer(str(default_model_dir()), device="cpu")
