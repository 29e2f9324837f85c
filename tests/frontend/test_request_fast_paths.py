"""The request path's shortcuts give what the slow path gives: token-id inputs validated at once, and
exact routes dispatched past Starlette's router."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError
from starlette.routing import Route

from quiver.frontend.app import exact_routes
from typing import Union

from pydantic import BaseModel, StrictStr

from quiver.frontend.schemas import EmbeddingRequest, EmbedRequest, TokenIdList, TokenIdLists, TokenIds


async def _endpoint(request):  # pragma: no cover - never called
    raise AssertionError


@pytest.mark.parametrize("value", [[1, 2, 3], [2**70], [-5], [0] * 300])
def test_flat_token_ids_are_taken_as_they_are(value):
    assert EmbeddingRequest.model_validate({"input": value}).input == value
    assert EmbedRequest.model_validate({"inputs": value}).inputs == value


@pytest.mark.parametrize("value", [[1, 2, 3], [0, 1, 5], [-5, 2**31 - 1, -2**31], [7] * 5000])
def test_flat_token_ids_within_int32_come_with_their_array(value):
    taken = EmbeddingRequest.model_validate({"input": value}).input
    assert isinstance(taken, TokenIdList) and taken == value
    assert taken.ids.dtype == np.int32 and taken.ids.tolist() == value


@pytest.mark.parametrize("value", [[2**31], [1, -2**31 - 1], [2**70]])
def test_flat_token_ids_beyond_int32_stay_a_plain_list(value):
    taken = EmbeddingRequest.model_validate({"input": value}).input
    assert type(taken) is list and taken == value


@pytest.mark.parametrize("value", [[True], [1, True], [5, False, 6], [0, 1, True, 0], [1.0], [3, 1.5], [1, "a"],
                                   [1, None], [[1], 2], [2, [1]], [2**70, True], None, 1])
def test_other_inputs_keep_the_unions_errors(value):
    with pytest.raises(ValidationError) as caught:
        EmbeddingRequest.model_validate({"input": value})
    errors = caught.value.errors()
    assert errors and all(error["loc"][0] == "input" for error in errors)


class PlainUnion(BaseModel):
    """The input union without the shortcut: what every input must validate to, and every error."""

    input: Union[StrictStr, list[StrictStr], TokenIds, list[TokenIds]]


@pytest.mark.parametrize("value", [[[1, 2, 3]], [[0, 1, 5], [7]], [[-5, 2**31 - 1], [-2**31]], [[7] * 5000, [3]],
                                   [[5, 1], [0, 7], [1]], [[9]] * 300])
def test_lists_of_token_ids_within_int32_come_with_their_array(value):
    taken = EmbeddingRequest.model_validate({"input": value}).input
    assert isinstance(taken, TokenIdLists) and taken == value == PlainUnion.model_validate({"input": value}).input
    assert taken.ids.dtype == np.int32 and taken.ids.tolist() == [x for row in value for x in row]
    assert taken.lens == [len(row) for row in value]
    assert EmbedRequest.model_validate({"inputs": value}).inputs == value


@pytest.mark.parametrize("value", [[[2**31]], [[1], [2, -2**31 - 1]], [[1], []], [[]], [[], [1]]])
def test_lists_of_token_ids_beyond_int32_or_with_an_empty_list_stay_plain_lists(value):
    taken = EmbeddingRequest.model_validate({"input": value}).input
    assert type(taken) is list and taken == value


@pytest.mark.parametrize("value", [[True], [1, True], [5, False, 6], [0, 1, True, 0], [1.0], [3, 1.5], [1, "a"],
                                   [1, None], [[1], 2], [2, [1]], [2**70, True], [[True]], [[1], [True]],
                                   [[5, 1], [True, 7]], [[5, 6], [7, 1, False]], [[0, True]], [[1.0]], [[1], [2, "a"]],
                                   [[1], None], [[[1]]], [[1], [2**70, True]], [["a"]], [[1], ["a"]]])
def test_the_shortcut_gives_the_unions_own_errors(value):
    with pytest.raises(ValidationError) as caught:
        EmbeddingRequest.model_validate({"input": value})
    with pytest.raises(ValidationError) as plain:
        PlainUnion.model_validate({"input": value})
    assert caught.value.errors() == plain.value.errors()


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
