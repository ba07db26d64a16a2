"""``POST /v1/events``: emit an event that durable waits wake on (producer scope;
the first payload wins: 201, then 200 with ``created: false``; bad input 422)."""

from __future__ import annotations

import httpx

from .conftest import wait_for


def test_emit_an_event(api):
    r = api.post("/v1/events", json={"key": "paid:1", "payload": {"amount": 30}})
    assert r.status_code == 201, r.text
    assert r.json() == {"key": "paid:1", "created": True, "woken": 0}
    again = api.post("/v1/events", json={"key": "paid:1", "payload": "later"})
    assert again.status_code == 200
    assert again.json() == {"key": "paid:1", "created": False, "woken": 0}
    assert api.post("/v1/events", json={"key": ""}).status_code == 422
    bad = api.post("/v1/events", json={"key": "k", "extra": 1})
    assert bad.status_code == 422 and "extra" in bad.text
    assert api.post("/v1/events", json={"key": "x" * 513}).status_code == 422


def test_emitting_needs_a_producer_token(server, producer):
    _, worker = producer.create_token("worker")
    _, prod = producer.create_token("producer")
    wait_for(lambda: httpx.get(server.url + "/v1/jobs").status_code == 401, what="auth on")
    with server.client(worker) as w:
        assert w.post("/v1/events", json={"key": "k"}).status_code == 403
    with server.client(prod) as p:
        assert p.post("/v1/events", json={"key": "k"}).status_code == 201
