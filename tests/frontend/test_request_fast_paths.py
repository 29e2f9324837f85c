"""The request path's shortcuts give what the slow path gives: token-id inputs validated at once, and
exact routes dispatched past Starlette's router."""

from __future__ import annotations

import pytest
from pydantic import ValidationError
from starlette.routing import Route

from quiver.frontend.app import exact_routes
from quiver.frontend.schemas import EmbeddingRequest, EmbedRequest


async def _endpoint(request):  # pragma: no cover - never called
    raise AssertionError


@pytest.mark.parametrize("value", [[1, 2, 3], [2**70], [-5], [0] * 300])
def test_flat_token_ids_are_taken_as_they_are(value):
    assert EmbeddingRequest.model_validate({"input": value}).input == value
    assert EmbedRequest.model_validate({"inputs": value}).inputs == value


@pytest.mark.parametrize("value", [[True], [1, True], [1.0], [1, "a"], [[1], 2], None, 1])
def test_other_inputs_keep_the_unions_errors(value):
    with pytest.raises(ValidationError) as caught:
        EmbeddingRequest.model_validate({"input": value})
    errors = caught.value.errors()
    assert errors and all(error["loc"][0] == "input" for error in errors)


def test_exact_routes_leave_parameters_and_shadowed_paths_to_the_router():
    routes = [Route("/a", _endpoint, methods=["POST"]), Route("/items/{item}", _endpoint, methods=["GET"]),
              Route("/items/special", _endpoint, methods=["GET"]), Route("/a", _endpoint, methods=["GET"]),
              Route("/b", _endpoint, methods=["GET"])]
    exact = exact_routes(routes)
    assert set(exact) == {("POST", "/a"), ("GET", "/b"), ("HEAD", "/b")}  # GET /a: after a route of its path
    assert exact["POST", "/a"] is routes[0].app


def test_chunk_ids_are_distinct_hex_and_a_forked_child_draws_its_own():
    import os

    from quiver.frontend.broker_client import RandomIds

    ids = RandomIds()
    drawn = [ids.new() for _ in range(600)]  # over two reads of the pool
    assert len(set(drawn)) == 600 and all(len(each) == 32 and int(each, 16) >= 0 for each in drawn)
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # pragma: no cover - the child's side
        os.write(write, ids.new().encode())
        os._exit(0)
    os.waitpid(child, 0)
    assert os.read(read, 64).decode() != ids.new()
