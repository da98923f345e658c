"""The contract between server and clients: recorded replies of a real server against tapdeck.schema.

The recording (tests/schema/fixtures/api.json) is written by `python -m tests.schema.record`;
these tests check it against the `response_model` each admin route declares and the event models,
field by field (a key the server sends that the model lacks is drift too), and re-record it to see
that it is not stale. The TUI's recorded fixture (tests/app/fixtures/api.json) is held to the same
models.
"""

from __future__ import annotations

import json
import types
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from pydantic import BaseModel

from tapdeck.proxy.http.server import create_app
from tapdeck.proxy.service import CaptureService
from tapdeck.proxy.store.database import Store
from tapdeck.runner.api import create_runner_router
from tapdeck.schema.activity import SessionActivity
from tapdeck.schema.catalog import Catalog
from tapdeck.schema.events import EVENT_TYPES, parse_event
from tapdeck.schema.runs import RunDetail, RunList
from tapdeck.schema.sessions import (
    GraphView,
    Health,
    RolloutDocument,
    SessionDetail,
    SessionList,
    TurnDetail,
)
from tapdeck.schema.train import RecipeList, TrainLog, TrainMetrics, TrainRunList, parse_train_event
from tests.schema.record import FIXTURE, NOT_RECORDED, record

TUI_FIXTURE = Path(__file__).parents[1] / "app" / "fixtures" / "api.json"
STREAMS = {"GET /admin/events", "GET /admin/train/{run_id}/events"}
"""SSE routes: each line is an event (schema.events, schema.train's TrainEvent), not one reply."""


@pytest.fixture(scope="module")
def recording() -> dict[str, Any]:
    return json.loads(FIXTURE.read_text())


@pytest.fixture(scope="module")
def admin_routes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, APIRoute]:
    """`METHOD /path` → route, for the server's app with the runner's routes mounted."""
    data = tmp_path_factory.mktemp("contract")
    service = CaptureService(Store(data / "capture.db"), default_engine=None, public_url="http://127.0.0.1:9")
    app: FastAPI = create_app(
        service,
        admin_key="contract-test",
        routers=[create_runner_router(service, data_dir=data, default_engine=None)],
    )
    return {
        f"{method} {route.path}": route
        for route in _api_routes(app.routes)
        for method in route.methods
        if route.path.startswith("/admin") or route.path == "/health"
    }


def _api_routes(routes: list[Any]) -> list[APIRoute]:
    """Every APIRoute, through included routers (FastAPI keeps those as their own entries)."""
    out: list[APIRoute] = []
    for route in routes:
        if isinstance(route, APIRoute):
            out.append(route)
        elif hasattr(route, "original_router"):
            out.extend(_api_routes(route.original_router.routes))
    return out


def _model_of(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        return next((m for a in get_args(annotation) if (m := _model_of(a)) is not None), None)
    return None


def shape(value: Any, annotation: Any, at: str = "$") -> tuple[set[str], set[str]]:
    """(the model fields present along `value`, keys of `value` no model field names).

    Walks the value alongside its type: models field by field, lists item by item; free-form
    parts (`dict[str, Any]`: metadata, messages) are not looked into."""
    model = _model_of(annotation)
    if model is not None and isinstance(value, dict):
        fields, unknown = {at}, {f"{at}.{k}" for k in value if k not in model.model_fields}
        for name, info in model.model_fields.items():
            if name in value:
                more, odd = shape(value[name], info.annotation, f"{at}.{name}")
                fields |= more
                unknown |= odd
        return fields, unknown
    if get_origin(annotation) in (Union, types.UnionType):
        lists = [a for a in get_args(annotation) if get_origin(a) is list]
        if lists and isinstance(value, list):
            return shape(value, lists[0], at)
    if get_origin(annotation) is list and isinstance(value, list):
        fields, unknown = set(), set()
        for item in value:
            more, odd = shape(item, get_args(annotation)[0], f"{at}[]")
            fields |= more
            unknown |= odd
        return fields, unknown
    return {at}, set()


def _event_annotation(event: dict[str, Any]) -> Any:
    parsed = parse_event(event)
    assert parsed is not None, f"unknown event type {event.get('type')!r}"
    return type(parsed)


def _shapes(recording: dict[str, Any], routes: dict[str, APIRoute]) -> dict[str, set[str]]:
    out = {key: shape(body, routes[key].response_model)[0] for key, body in recording["routes"].items()}
    for event in recording["events"]:
        out.setdefault(f"event {event['type']}", set()).update(shape(event, _event_annotation(event))[0])
    return out


def test_every_admin_route_declares_its_response_model(admin_routes: dict[str, APIRoute]) -> None:
    assert {"GET /health", "POST /admin/sessions", "GET /admin/runs"} <= set(admin_routes)
    undeclared = [
        key
        for key, route in admin_routes.items()
        if key not in STREAMS and _model_of(route.response_model) is None
    ]
    assert undeclared == []


def test_every_admin_route_is_recorded_or_said_why_not(
    recording: dict[str, Any], admin_routes: dict[str, APIRoute]
) -> None:
    assert set(admin_routes) == set(recording["routes"]) | set(NOT_RECORDED) | STREAMS
    assert not set(recording["routes"]) & set(NOT_RECORDED)


def test_recorded_replies_validate_against_their_routes_models_with_no_key_left_over(
    recording: dict[str, Any], admin_routes: dict[str, APIRoute]
) -> None:
    recorded = set(admin_routes) - set(NOT_RECORDED) - STREAMS
    assert recorded and set(recording["routes"]) == recorded
    for key, body in recording["routes"].items():
        model = _model_of(admin_routes[key].response_model)
        model.model_validate(body)
        assert shape(body, model)[1] == set(), f"{key} sends keys its model lacks"


def test_every_event_type_is_recorded_and_validates_with_no_key_left_over(recording: dict[str, Any]) -> None:
    assert {e["type"] for e in recording["events"]} == EVENT_TYPES
    for event in recording["events"]:
        assert shape(event, _event_annotation(event))[1] == set(), event["type"]


def test_the_tuis_recorded_fixture_holds_to_the_same_models() -> None:
    """Every body `python -m tests.app.record` wrote, against the model its route declares."""
    data = json.loads(TUI_FIXTURE.read_text())
    train = data["train"]
    bodies: list[tuple[Any, Any]] = [
        (Health, data["health"]),
        (Catalog, data["catalog"]),
        (SessionList, {"sessions": data["sessions"]}),
        (RunList, {"runs": data["runs"]}),
        (RecipeList, train["recipes"]),
        (TrainRunList, train["runs"]),
    ]
    bodies += [(SessionDetail, s) for s in data["session_details"].values()]
    bodies += [(SessionActivity, a) for a in data["activity"].values()]
    bodies += [(RunDetail, r) for r in data["run_details"].values()]
    bodies += [(RolloutDocument, d) for d in data["rollouts"].values()]
    bodies += [(TurnDetail, t) for turns in data["turns"].values() for t in turns.values()]
    bodies += [(GraphView, g) for g in data["graphs"].values()]
    bodies += [(TrainLog, log) for log in train["logs"].values()]
    bodies += [(TrainMetrics, m) for m in train["metrics"].values()]
    kinds = {model for model, _ in bodies}
    assert kinds == {
        Health,
        Catalog,
        SessionList,
        RunList,
        RecipeList,
        TrainRunList,
        SessionDetail,
        SessionActivity,
        RunDetail,
        RolloutDocument,
        TurnDetail,
        GraphView,
        TrainLog,
        TrainMetrics,
    }, "the recording lacks a kind of body"
    for model, body in bodies:
        model.model_validate(body)
        assert shape(body, model)[1] == set(), model.__name__
    events = [e for run in train["events"].values() for e in run]
    for event in events:
        assert shape(event, type(parse_train_event(event)))[1] == set(), event["type"]
    assert {e["type"] for e in events} == {"log", "metrics", "state"}
    assert set(data["session_details"]) == set(data["activity"]) == {s["id"] for s in data["sessions"]}


def test_the_shape_check_sees_a_field_the_model_lacks() -> None:
    body = {"status": "ok", "instance": "x", "uptime_s": 3}
    assert shape(body, Health)[1] == {"$.uptime_s"}


@pytest.mark.slow
def test_the_recording_is_not_stale(
    recording: dict[str, Any], admin_routes: dict[str, APIRoute], tmp_path: Path
) -> None:
    """A fresh recording has the same routes, event types and fields as the committed one
    (values differ: ids, times); when this fails, run `python -m tests.schema.record`."""
    fresh = record(tmp_path)
    assert _shapes(fresh, admin_routes) == _shapes(recording, admin_routes)


def test_graph_view_since_n_is_the_documents_headers_from_n_without_tokens(recording: dict[str, Any]) -> None:
    doc = recording["routes"]["GET /admin/sessions/{session_id}/rollout"]
    view = GraphView.model_validate(recording["routes"]["GET /admin/sessions/{session_id}/graph"])
    assert view.since == 1 and view.turns
    assert [t.seq for t in view.turns] == [t["seq"] for t in doc["turns"][1:]]
    assert view.links == [(t["seq"], t["parent"], t["role"]) for t in doc["turns"]]
    for header in view.turns:
        full = next(t for t in doc["turns"] if t["seq"] == header.seq)
        assert {k: full[k] for k in type(header).model_fields if k in full} == header.model_dump(
            mode="json", exclude={"token_in"}
        )
    assert view.stats.model_dump() == doc["stats"]
    sent = shape(recording["routes"]["GET /admin/sessions/{session_id}/graph"], GraphView)[0]
    heavy = {"input_ids", "logprobs", "sampled_ids", "request", "response", "sequences"}
    assert not {path.rsplit(".", 1)[-1].rstrip("[]") for path in sent} & heavy
