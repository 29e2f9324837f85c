"""--model as a directory or a hub id: resolve_model_dir against a Hugging Face cache laid out at test
time the way huggingface_hub lays it out (blobs, snapshots/<revision> of symlinks, refs/main)."""

from __future__ import annotations

from pathlib import Path

import pytest

from quiver.common.model_info import ModelError, default_model_dir, load_model_info, resolve_model_dir


def cache_model(hub: Path, repo_id: str, revision: str, ref: bool = True) -> Path:
    """Lay the packaged MiniLM out in `hub` as repo_id at `revision`; the snapshot directory."""
    repo = hub / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / revision
    for source in default_model_dir().rglob("*"):
        if source.is_file():
            relative = source.relative_to(default_model_dir())
            blob = repo / "blobs" / f"{revision}-{str(relative).replace('/', '--')}"
            blob.parent.mkdir(parents=True, exist_ok=True)
            blob.write_bytes(source.read_bytes())
            link = snapshot / relative
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(blob)
    if ref:
        (repo / "refs").mkdir(exist_ok=True)
        (repo / "refs" / "main").write_text(revision)
    return snapshot


def test_empty_is_the_packaged_model_and_a_directory_is_itself(tmp_path):
    assert resolve_model_dir("") == default_model_dir()
    assert resolve_model_dir(str(tmp_path)) == tmp_path


def test_a_hub_id_in_hf_home_resolves_to_the_revision_main_names(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    cache_model(tmp_path / "hf" / "hub", "sentence-transformers/all-MiniLM-L6-v2", "0123abc")
    main = cache_model(tmp_path / "hf" / "hub", "sentence-transformers/all-MiniLM-L6-v2", "4567def")
    found = resolve_model_dir("sentence-transformers/all-MiniLM-L6-v2")
    assert found == main
    info = load_model_info(found)
    assert info.hidden_size == 384 and info.kind == "embedding"


def test_hf_hub_cache_wins_and_without_refs_the_newest_snapshot_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "elsewhere"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    snapshot = cache_model(tmp_path / "cache", "org/model-1.5", "89ab", ref=False)
    assert resolve_model_dir("org/model-1.5") == snapshot


def test_a_hub_id_not_in_the_cache_says_how_to_make_a_local_copy(tmp_path, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ModelError) as raised:
        resolve_model_dir("BAAI/bge-small-en-v1.5")
    message = str(raised.value)
    assert "huggingface-cli download BAAI/bge-small-en-v1.5 --local-dir DIR" in message
    assert str(tmp_path / "hub") in message


def test_a_relative_path_that_does_not_exist_is_not_taken_for_a_hub_id(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert resolve_model_dir("./models/minilm") == Path("./models/minilm")
    with pytest.raises(ModelError, match="does not exist"):
        load_model_info(resolve_model_dir("/no/such/checkpoint"))
