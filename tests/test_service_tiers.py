"""Service tiers on the HTTP API: OpenAI's `service_tier` and vLLM's `priority`.

Under --scheduling-policy priority, "auto"/"default" are interactive (priority 0) and "flex" the
batch tier (a large priority); an explicit `priority` wins.  Under fcfs every tier is served in
arrival order and a priority other than 0 is a 400, as in vLLM.  Unknown tiers and non-int
priorities are 400s naming the field; answers are the same whatever the tier; no block is left.
"""

from __future__ import annotations

import httpx
import pytest

from minilm_engine import LLM
from minilm_engine.course.experiments.server_thread import ServerThread
from minilm_engine.entrypoints.openai.serving import SERVICE_TIER_PRIORITY

MODEL = "noodle-apprentice"
BODY = {"model": MODEL, "prompt": "Order for table 7:\n", "max_tokens": 10, "temperature": 0}


@pytest.fixture(scope="module")
def servers():
    fcfs = ServerThread(LLM(MODEL, device="cpu", record_trace=False)).start()
    prio = ServerThread(LLM(MODEL, device="cpu", record_trace=False, scheduling_policy="priority")).start()
    yield fcfs, prio
    fcfs.stop()
    prio.stop()


def post(server, body):
    return httpx.post(server.url + "/v1/completions", json=body, timeout=60)


def test_tiers_map_to_priorities_and_answers_stay_the_same(servers, monkeypatch):
    fcfs, prio = servers
    want = post(fcfs, BODY).json()["choices"][0]["text"]
    seen = []
    engine = prio.engine.engine
    original = engine.add_prepared_request
    monkeypatch.setattr(engine, "add_prepared_request", lambda r: (seen.append(r.priority), original(r))[1])
    for extra in ({}, {"service_tier": "auto"}, {"service_tier": "default"}, {"service_tier": "flex"},
                  {"service_tier": "flex", "priority": -2}, {"priority": 7}, {"service_tier": None}):
        reply = post(prio, {**BODY, **extra})
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["text"] == want
    assert seen == [0, 0, 0, SERVICE_TIER_PRIORITY["flex"], -2, 7, 0]
    for server in servers:  # fcfs accepts every tier (served in arrival order) and priority 0
        for extra in ({"service_tier": "flex"}, {"priority": 0}):
            assert post(server, {**BODY, **extra}).status_code == 200
        assert server.engine.engine.block_pool.num_used_blocks == 0


@pytest.mark.parametrize("extra, param, words", [
    ({"service_tier": "scale"}, "service_tier", "service_tier must be one of"),
    ({"service_tier": 1}, "service_tier", "valid string"),
    ({"priority": 1.5}, "priority", "valid integer"),
    ({"priority": "high"}, "priority", "valid integer"),
    ({"priority": [1]}, "priority", "valid integer"),
])
def test_bad_tiers_and_priorities_are_400s_naming_the_field(servers, extra, param, words):
    for server in servers:
        reply = post(server, {**BODY, **extra})
        assert reply.status_code == 400
        error = reply.json()["error"]
        assert error["param"] == param and words in error["message"], error


def test_a_priority_under_fcfs_is_a_400_that_says_how_to_enable_it(servers):
    fcfs, _ = servers
    reply = post(fcfs, {**BODY, "priority": 3})
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert error["param"] == "priority" and "--scheduling-policy priority" in error["message"]
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "priority": -1}
    reply = httpx.post(fcfs.url + "/v1/chat/completions", json=chat, timeout=60)
    assert reply.status_code == 400 and reply.json()["error"]["param"] == "priority"
    assert fcfs.engine.engine.block_pool.num_used_blocks == 0
