"""A `specview serve` that runs for days (a real uvicorn on a loopback port, tiny models): its session profile
keeps the newest steps only; a client that leaves without streaming cancels its request, running or
waiting; what can never run (prompt + N past the context, chat without a template) is refused on arrival,
not when its turn comes. Each test waits for something it can observe, with generous timeouts."""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from serve_helpers import TIMEOUT, running_server, wait_for

from helpers import run_cli
from specview.settings import Settings


@pytest.fixture
def settings(gpt2_paths, tmp_path):
    return Settings(target=gpt2_paths[0], draft=gpt2_paths[1], max_new_tokens=8, k=3, temperature=0.0,
                    threads=1, profile_dir=str(tmp_path / "profiles"))


@pytest.fixture
def gated_steps(monkeypatch):
    """Every Run.step waits for the returned Event: the engine thread is held busy for as long as a test needs."""
    from specview.engine import Run

    real_step, gate = Run.step, threading.Event()

    def gated(self):
        gate.wait(TIMEOUT)
        return real_step(self)

    monkeypatch.setattr(Run, "step", gated)
    yield gate
    gate.set()


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_what_can_never_run_is_refused_on_arrival(settings, gated_steps, stream):
    """Prompt + N past the context, chat without a template: 422 naming the field, answered while the engine
    thread is provably busy with another request (it is held), so neither was queued to find out."""
    bad = [({"prompt": "w1 " * 100, "max_new_tokens": 30}, "max_new_tokens", "past the context"),
           ({"prompt": "w1", "chat": True}, "chat", "no chat template")]
    with running_server(settings) as served, httpx.Client(base_url=served.url, timeout=TIMEOUT) as client:
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(client.post, "/generate", json={"prompt": "w1", "max_new_tokens": 3})
            wait_for(lambda h: h["running"], "the first request to run", client)
            for body, field, needle in bad:
                r = client.post("/generate", json={**body, "stream": stream})
                assert r.status_code == 422, r.text
                assert r.json()["field"] == field and needle in r.json()["error"], r.json()
            health = client.get("/health").json()
            assert health["running"] and health["queue"] == 0  # still held; nothing queued behind it
            gated_steps.set()
            assert first.result(TIMEOUT).status_code == 200
        assert 'specview:requests_rejected_total{status="422"} 2.0' in client.get("/metrics").text


def test_the_session_profile_keeps_the_newest_steps(settings, capsys):
    with running_server(settings, profile_max_steps=5) as served:
        with httpx.Client(base_url=served.url, timeout=TIMEOUT) as client:
            answers = [client.post("/generate", json={"prompt": "w1 w2", "max_new_tokens": 4, "k": 1,
                                                      "ignore_eos": True}).json() for _ in range(4)]
    every = [a["request"] for a in answers for _ in range(a["summary"]["steps"])]  # each step's request, in order
    assert len(every) > 5
    with open(served.worker.profile_path) as f:
        doc = json.load(f)
    assert [s["run"] for s in doc["steps"]] == every[-5:]
    assert doc["summary"]["steps"] == 5 and doc["summary"]["steps_dropped"] == len(every) - 5
    assert doc["meta"]["max_steps"] == 5
    kept_runs = sorted(set(every[-5:]))
    assert [s.run for s in served.worker.summaries] == kept_runs  # the older runs' summaries went too
    assert len(doc["summary"]["stop_reasons"]) == len(kept_runs)
    code, out, err = run_cli(capsys, "report", served.worker.profile_path)
    assert code == 0 and f"{len(every) - 5} older ones were let go" in " ".join(out.split())


def test_profile_max_steps_is_checked(capsys):
    code, out, err = run_cli(capsys, "serve", "--profile-max-steps", "-1")
    assert code == 2 and "--profile-max-steps" in err and len(err.strip().splitlines()) == 1
