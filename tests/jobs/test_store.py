"""The bulk-job store on a real SQLite file: ownership, the part commit's guard, expiry, a full disk."""

from __future__ import annotations

import time

import pytest

from quiver.jobs.store import ResultLine, Store, StoreFull, derived_file_id, owner_of


@pytest.fixture()
def store(tmp_path):
    instance = Store(tmp_path / "data")
    yield instance
    instance.close()


def _batch(store: Store, owner: str) -> str:
    store.path_of("file-in").write_text('{"custom_id": "a"}\n')
    store.add_file("file-in", owner, 20, 1, "in.jsonl", "batch", ttl_s=3600)
    return store.add_batch(owner, "/v1/embeddings", "file-in", 86400, "24h", None)["id"]


def test_one_key_never_sees_another_keys_objects(store):
    alice, bob = owner_of("key-alice"), owner_of("key-bob")
    assert alice != bob and "key-alice" not in alice
    batch_id = _batch(store, alice)
    assert store.get_file("file-in", alice)["object"] == "file"
    assert store.get_file("file-in", bob) is None
    assert store.get_batch(batch_id, bob) is None
    assert store.list_batches(bob, 10, None) == ([], False)
    assert store.request_cancel(batch_id, bob) == (None, False)
    assert store.get_batch(batch_id, alice)["status"] == "validating"
    assert not store.delete_file("file-in", bob)
    assert store.path_of("file-in").exists()


def test_a_part_commits_only_where_the_cursor_stands(store):
    batch_id = _batch(store, "")
    part = [ResultLine(0, True, '{"custom_id": "a"}'), ResultLine(1, False, '{"custom_id": "b"}')]
    assert store.commit_part(batch_id, part, 0, 2, 40)
    # A second runner holding the same part (its lease ran out midway) writes nothing.
    assert not store.commit_part(batch_id, part, 0, 2, 40)
    row = store.row(batch_id)
    assert (row["next_line"], row["next_offset"], row["completed"], row["failed"]) == (2, 40, 1, 1)
    assert list(store.results(batch_id, True)) == ['{"custom_id": "a"}']


def test_finishing_twice_rewrites_the_same_files(store, tmp_path):
    batch_id = _batch(store, "")
    store.commit_part(batch_id, [ResultLine(0, True, '{"x": 1}')], 0, 1, 10)
    path = store.path_of(derived_file_id(batch_id, "output"))
    assert store.write_results(batch_id, True, path) == (len('{"x": 1}\n'), 1)
    store.finish(batch_id, "", "completed", {"output": (9, 1)}, ttl_s=3600)
    batch = store.get_batch(batch_id, "")
    assert batch["status"] == "completed" and batch["output_file_id"] == derived_file_id(batch_id, "output")
    assert batch["completed_at"] is not None and batch["error_file_id"] is None
    assert list(store.results(batch_id, True)) == []  # result rows go once the file holds them


def test_expired_files_are_deleted_with_their_bodies(store):
    store.path_of("file-old").write_text("x\n")
    store.add_file("file-old", "", 2, 1, "old.jsonl", "batch", ttl_s=60)
    store.path_of("file-kept").write_text("y\n")
    store.add_file("file-kept", "", 2, 1, "kept.jsonl", "batch", ttl_s=0)
    assert store.expire_files(now=time.time() + 120) == 1
    assert store.get_file("file-old", "") is None and not store.path_of("file-old").exists()
    assert store.get_file("file-kept", "") is not None


def test_a_full_disk_commits_nothing_and_says_so(store):
    batch_id = _batch(store, "")
    pages = store.db.execute("PRAGMA page_count").fetchone()[0]
    store.db.execute(f"PRAGMA max_page_count = {pages + 1}")  # SQLite's own "disk full" at the next page
    big = [ResultLine(i, True, "x" * 4000) for i in range(50)]
    with pytest.raises(StoreFull):
        store.commit_part(batch_id, big, 0, 50, 1000)
    assert store.row(batch_id)["next_line"] == 0
    assert list(store.results(batch_id, True)) == []
    store.db.execute("PRAGMA max_page_count = 1073741823")
    assert store.commit_part(batch_id, big, 0, 50, 1000)


def test_the_database_is_in_wal_mode(store):
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
