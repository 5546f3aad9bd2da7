"""The API's error bodies as the CLI prints them: one line per problem, the right exit code."""

from __future__ import annotations

from typing import Any

import httpx

from service.cli.client import EXIT_DOES_NOT_FIT, EXIT_ERROR, error_from_response
from service.cli.render import EXIT_DOES_NOT_FIT as RENDER_DOES_NOT_FIT
from service.cli.render import EXIT_ERROR as RENDER_ERROR


def response(status: int, error: dict[str, Any]) -> httpx.Response:
    return httpx.Response(status, json={"error": error})


def test_the_two_modules_agree_on_the_codes() -> None:
    assert (EXIT_ERROR, EXIT_DOES_NOT_FIT) == (RENDER_ERROR, RENDER_DOES_NOT_FIT)


def test_a_422_with_fields_lists_each_field_once() -> None:
    exc = error_from_response(response(422, {
        "code": "invalid_spec", "message": "invalid spec: training.global_batch: Input should be greater than 0",
        "fields": [{"loc": "training.global_batch", "message": "Input should be greater than 0"},
                   {"loc": "resources.gpu", "message": "Value error, unknown GPU 'H900'"}]}))
    assert exc.is_invalid_spec and exc.exit_code == EXIT_ERROR
    assert [p.path for p in exc.problems] == ["training.global_batch", "resources.gpu"]
    lines = str(exc).splitlines()
    assert lines == ["invalid spec (invalid_spec, HTTP 422)",
                     "  training.global_batch: Input should be greater than 0",
                     "  resources.gpu: unknown GPU 'H900'"]


def test_a_422_validation_summary_is_not_repeated() -> None:
    exc = error_from_response(response(422, {
        "code": "validation_error", "message": "invalid request: limit: Input should be less than 201",
        "fields": [{"loc": "limit", "message": "Input should be less than 201"}]}))
    assert str(exc).splitlines() == ["invalid request (validation_error, HTTP 422)",
                                     "  limit: Input should be less than 201"]


def test_problems_in_details_print_the_same_way() -> None:
    exc = error_from_response(response(422, {
        "code": "invalid_spec", "message": "invalid spec", "fields": [],
        "details": {"problems": [{"loc": ["layout", "tp"], "message": "tp=3 must divide heads"},
                                 {"path": "backend.kind", "msg": "no dispatcher runs it"}]}}))
    assert exc.is_invalid_spec
    assert str(exc).splitlines()[1:] == ["  layout.tp: tp=3 must divide heads", "  backend.kind: no dispatcher runs it"]


def test_a_member_token_without_team_keeps_its_message() -> None:
    exc = error_from_response(response(422, {
        "code": "validation_error", "message": "a member token needs a team",
        "fields": [{"loc": "team", "message": "required for role member"}]}))
    assert str(exc).splitlines() == ["a member token needs a team (validation_error, HTTP 422)",
                                     "  team: required for role member"]


def test_does_not_fit_exits_2_with_a_line_per_reason() -> None:
    exc = error_from_response(response(422, {
        "code": "does_not_fit", "message": "no layout fits: a; b", "fields": [],
        "details": {"reasons": ["a", "b"], "min_gpus_to_fit": 16, "closest": {}}}))
    assert exc.exit_code == EXIT_DOES_NOT_FIT and not exc.is_invalid_spec
    assert str(exc).splitlines() == ["no layout fits (does_not_fit, HTTP 422)", "  a", "  b",
                                     "  smallest GPU count that fits: 16"]


def test_unauthorized_says_how_to_get_a_token() -> None:
    exc = error_from_response(response(401, {"code": "unauthorized", "message": "unknown token"}))
    assert "token create --admin" in str(exc) and exc.exit_code == EXIT_ERROR


def test_a_body_that_is_not_the_error_shape() -> None:
    exc = error_from_response(httpx.Response(502, text="Bad Gateway"))
    assert str(exc) == "HTTP 502: Bad Gateway" and exc.exit_code == EXIT_ERROR
