"""A cluster shared by the bulk-job tests: one broker, one CPU worker, a frontend with small batch limits."""

from __future__ import annotations

import pytest

from tests.cluster import Cluster


@pytest.fixture(scope="session")
def jobs_cluster():
    instance = Cluster(workers=1, frontend_args=["--batch-max-lines", "1000", "--batch-max-file-bytes", "400000"])
    instance.start()
    yield instance
    instance.stop()
