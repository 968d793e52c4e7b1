"""`specview serve` answers while its models load (a real uvicorn on a loopback port, tiny models): /health says
"loading" with 503 (200 only once requests are served; /live answers 200 throughout) and the requests get 503 with Retry-After until the load ends; then they run. A load that fails shows
on /health and in every answer; a stop while the models load ends the server without waiting for the load. The
load is held on an Event the test releases (loading.load_session patched), never on a clock."""

from __future__ import annotations

import httpx
import pytest
from serve_helpers import TIMEOUT, holding_the_load, running_server, wait_for

from specview.core.errors import SpecviewError
from specview.serve import loading


@pytest.fixture
def held_load(monkeypatch):
    with holding_the_load(monkeypatch) as held:
        yield held


def test_health_answers_while_the_models_load_and_requests_get_503_until_they_have(settings, held_load):
    body = {"prompt": "w1 w2", "max_new_tokens": 3, "ignore_eos": True}
    with running_server(settings, ready=False) as served, httpx.Client(base_url=served.url, timeout=TIMEOUT) as client:
        assert held_load.entered.wait(TIMEOUT)
        health = client.get("/health")
        # readiness: 503 until requests will be served (a probe takes 200 for ready), the same JSON, Retry-After
        assert health.status_code == 503 and int(health.headers["retry-after"]) >= 1
        loading_now = health.json()
        live = client.get("/live")  # liveness: up, whatever it is doing
        assert live.status_code == 200 and live.json()["status"] == "loading"
        assert loading_now["status"] == "loading" and loading_now["loading"] == "held by the test"
        assert loading_now["error"] is None and loading_now["queue"] == 0 and loading_now["running"] is False
        # what will load, said before it has: the keys of a loaded server's /health, all there
        assert loading_now["target"] == settings.target and loading_now["drafters"] == [settings.draft]
        assert loading_now["device"] is None and "forwards_building" in loading_now
        for path in ("/generate", "/predict"):
            early = client.post(path, json={"prompt": "w1 w2"} if path == "/predict" else body)
            assert early.status_code == 503, early.text
            assert int(early.headers["retry-after"]) >= 1
            assert "loading" in early.json()["error"] and early.json()["field"] is None
        assert client.get("/openapi.json").json()["components"]["schemas"]["GenerateRequest"]

        held_load.release.set()
        ready = wait_for(lambda health: health["status"] != "loading", "the models to load", client)
        assert ready["status"] == "ok" and ready["loading"] is None and ready["error"] is None
        assert client.get("/health").status_code == 200 and client.get("/live").status_code == 200
        assert ready["device"] == "cpu" and ready["load_s"] > 0
        answer = client.post("/generate", json=body)
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["generated_ids"]) == 3
    assert served.worker.served == 1  # the early requests never reached the engine


def test_a_load_that_fails_shows_on_health_and_in_every_answer(settings, monkeypatch):
    def fails(settings, say):
        say("loading target nowhere")
        raise SpecviewError("cannot load nowhere: no such folder")

    monkeypatch.setattr(loading, "load_session", fails)
    with running_server(settings, ready=False) as served, httpx.Client(base_url=served.url, timeout=TIMEOUT) as client:
        health = wait_for(lambda health: health["status"] != "loading", "the load to end", client)
        assert health["status"] == "error" and health["error"] == "cannot load nowhere: no such folder"
        assert health["loading"] is None
        assert client.get("/health").status_code == 503  # never ready: no request will be served
        assert client.get("/live").status_code == 200
        answer = client.post("/generate", json={"prompt": "w1"})
        assert answer.status_code == 503 and "retry-after" not in answer.headers  # retrying will not help
        assert answer.json()["error"] == "the models failed to load: cannot load nowhere: no such folder"
    assert served.worker is None


def test_a_stop_while_the_models_load_ends_the_server_without_waiting_for_them(settings, held_load):
    with running_server(settings, ready=False) as served:
        assert held_load.entered.wait(TIMEOUT)
    # running_server has stopped it (as a signal would) and seen its thread end, the load still held
    assert served.loader.is_alive() and served.stop.reason == "requested"
    held_load.release.set()
    served.loader.join(TIMEOUT)
    assert not served.loader.is_alive()
    assert served.worker is None  # the models that loaded after the stop start no engine
