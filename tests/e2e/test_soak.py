"""A two-minute soak: after warm-up, the resident memory of frontend, broker and worker stays flat."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.cluster import Cluster
from tests.corpus import sentences
from tests.load import MixedLoad

pytestmark = pytest.mark.slow

SOAK_S = 120
WARM_UP_S = 25
SAMPLE_EVERY_S = 5
WINDOW = 3  # samples averaged at each end, so that one allocator swing does not decide the test
TOLERANCE = 0.10


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for {pid}")


def test_memory_stays_flat_over_a_two_minute_soak(st_model):
    texts = sentences(160)
    reference = st_model.encode(texts, normalize_embeddings=True)
    token_ids = [st_model.tokenizer(t)["input_ids"] for t in texts]
    with Cluster(workers=1) as cluster:
        roles = {"frontend": cluster.frontend, "broker": cluster.broker, "worker": cluster.worker_procs[0]}
        load = MixedLoad(cluster.url, texts, reference, token_ids, clients=3).start()
        time.sleep(WARM_UP_S)
        samples: dict[str, list[int]] = {name: [] for name in roles}
        for _ in range((SOAK_S - WARM_UP_S) // SAMPLE_EVERY_S):
            for name, proc in roles.items():
                samples[name].append(resident_bytes(proc.popen.pid))
            time.sleep(SAMPLE_EVERY_S)
        report = load.finish()
    after_warm_up = {name: sum(values[:WINDOW]) / WINDOW for name, values in samples.items()}
    at_end = {name: sum(values[-WINDOW:]) / WINDOW for name, values in samples.items()}
    print("\n" + report.summary("two-minute soak"))
    for name in samples:
        growth = at_end[name] / after_warm_up[name] - 1
        print(f"{name}: {after_warm_up[name] / 2**20:.1f} MiB after warm-up, {at_end[name] / 2**20:.1f} MiB at the end "
              f"({growth:+.1%})")
        assert growth <= TOLERANCE, f"{name} grew {growth:.1%}"
    assert not report.failures()
