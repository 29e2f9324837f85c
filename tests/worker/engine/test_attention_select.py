"""Borrowing a surveyed shape's attention backend for a shape first seen while serving."""

from __future__ import annotations

from quiver.worker.engine.layers.attention_select import nearest_winner, winner

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


PLANS = {"dense_cudnn": True, "triton_varlen": False, "aten_flash_varlen": False}


def test_graphs_take_the_fastest_even_where_it_builds_a_plan_per_shape():
    times = {"dense_cudnn": 0.100, "triton_varlen": 0.105, "aten_flash_varlen": 0.150}
    assert winner(times, PLANS.__getitem__, eager=False) == "dense_cudnn"


def test_eager_steps_take_the_fastest_backend_without_a_plan_within_the_margin():
    times = {"dense_cudnn": 0.100, "triton_varlen": 0.109, "aten_flash_varlen": 0.104}
    assert winner(times, PLANS.__getitem__, eager=True, margin=1.10) == "aten_flash_varlen"
    assert winner(times, PLANS.__getitem__, eager=True, margin=1.03) == "dense_cudnn"


def test_eager_steps_keep_the_fastest_when_it_builds_no_plan_or_none_is_without_one():
    assert winner({"dense_cudnn": 0.2, "triton_varlen": 0.1}, PLANS.__getitem__, eager=True) == "triton_varlen"
    assert winner({"dense_cudnn": 0.1}, PLANS.__getitem__, eager=True, margin=100.0) == "dense_cudnn"
