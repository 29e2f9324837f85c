"""Clusters shared by the bulk-job tests: one broker, one CPU worker, a frontend with small batch limits;
on the packaged model, and on a narrow random-weight model of its layout for the tests of 100,000 texts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.cluster import Cluster
from tests.jobs.helpers import small_minilm

FRONTEND_ARGS = ["--batch-max-lines", "1000", "--batch-max-file-bytes", "400000"]


@pytest.fixture(scope="session")
def jobs_cluster():
    instance = Cluster(workers=1, frontend_args=FRONTEND_ARGS)
    instance.start()
    yield instance
    instance.stop()


@pytest.fixture(scope="session")
def small_model(tmp_path_factory) -> Path:
    return small_minilm(tmp_path_factory.mktemp("small-model"))


@pytest.fixture(scope="session")
def small_jobs_cluster(small_model):
    instance = Cluster(workers=1, model=str(small_model), frontend_args=FRONTEND_ARGS)
    instance.start()
    yield instance
    instance.stop()
