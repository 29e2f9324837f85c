"""Borrowing a surveyed shape's attention backend for a shape first seen while serving."""

from __future__ import annotations

from quiver.worker.engine.layers.attention_select import nearest_winner

WINNERS = {
    (1, 128, 128, 128): "dense_flash",
    (1, 4096, 4096, 4096): "dense_cudnn",
    (16, 8192, 512, 512): "dense_cudnn",
    (4, 320, 128, 0): "torch_varlen",
    (8, 18432, 4096, 0): "padded_sdpa",
}


def test_dense_shapes_borrow_from_the_nearest_dense_shape():
    assert nearest_winner((1, 192, 192, 192), WINNERS, lambda name: True) == "dense_flash"
    assert nearest_winner((2, 6144, 3072, 3072), WINNERS, lambda name: True) == "dense_cudnn"


def test_ragged_shapes_never_borrow_a_dense_winner():
    assert nearest_winner((3, 200, 100, 0), WINNERS, lambda name: True) == "torch_varlen"
    assert nearest_winner((8, 16000, 4000, 0), WINNERS, lambda name: True) == "padded_sdpa"


def test_unusable_winners_are_skipped_and_none_means_measure():
    usable = lambda name: name != "dense_flash"  # noqa: E731
    assert nearest_winner((1, 160, 160, 160), WINNERS, usable) == "dense_cudnn"
    assert nearest_winner((1, 160, 160, 160), {}, usable) is None
    assert nearest_winner((3, 200, 100, 0), {k: v for k, v in WINNERS.items() if k[3] > 0}, usable) is None
