"""A `specview serve` that runs for days (a real uvicorn on a loopback port, tiny models): its session profile
keeps the newest steps only; a client that leaves without streaming cancels its request, running or
waiting; what can never run (prompt + N past the context, chat without a template) is refused on arrival,
not when its turn comes. Each test waits for something it can observe, with generous timeouts."""

from __future__ import annotations

import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlparse

import httpx
import pytest
from serve_helpers import TIMEOUT, running_server, wait_for

from helpers import run_cli


@pytest.fixture
def gated_steps(monkeypatch):
    """Every Run.step waits for the returned Event: the engine thread is held busy for as long as a test needs."""
    from specview.engine.decoder import Run

    real_step, gate = Run.step, threading.Event()

    def gated(self):
        gate.wait(TIMEOUT)
        return real_step(self)

    monkeypatch.setattr(Run, "step", gated)
    yield gate
    gate.set()


def post_raw(url: str, body: dict) -> socket.socket:
    """POST /generate (not streamed) on a bare socket, so the test decides when the connection closes."""
    where = urlparse(url)
    sock = socket.create_connection((where.hostname, where.port), timeout=TIMEOUT)
    data = json.dumps(body).encode()
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (where.netloc.encode(), len(data), data))
    return sock


def leave(sock: socket.socket) -> None:
    sock.shutdown(socket.SHUT_RDWR)
    sock.close()


def test_a_client_that_leaves_before_its_answer_cancels_its_request(settings):
    """Not streamed: the engine thread is held after the third step until the server has seen the client
    leave, so the cancel lands exactly at that step boundary; the next request is answered as usual."""
    with running_server(settings) as served, httpx.Client(base_url=served.url, timeout=TIMEOUT) as client:
        send, holding = served.worker._send, threading.Event()

        def send_then_hold(job, record, publish=True):
            send(job, record, publish)
            if record["type"] == "step" and record["step"] == 2 and job.request.max_new_tokens == 100:
                holding.set()
                job.cancelled.wait(TIMEOUT)  # what the engine thread does next depends only on the cancel

        served.worker._send = send_then_hold
        sock = post_raw(served.url, {"prompt": "w1 w2", "max_new_tokens": 100, "k": 1, "ignore_eos": True})
        assert holding.wait(TIMEOUT), "the request never reached its third step"
        leave(sock)
        wait_for(lambda h: not h["running"], "the cancelled request to end", client)
        [summary] = served.worker.summaries
        assert summary.stop_reason == "cancelled" and summary.steps == 3
        answer = client.post("/generate", json={"prompt": "w1 w2", "max_new_tokens": 5, "ignore_eos": True})
        assert answer.status_code == 200 and len(answer.json()["generated_ids"]) == 5
        page = client.get("/metrics").text
        assert 'specview:request_success_total{finished_reason="cancelled"} 1.0' in page


def test_a_client_that_leaves_while_its_request_waits_is_never_run(settings, gated_steps):
    with running_server(settings) as served, httpx.Client(base_url=served.url, timeout=TIMEOUT) as client:
        body = {"prompt": "w1", "max_new_tokens": 3, "ignore_eos": True}
        with ThreadPoolExecutor(1) as pool:
            first = pool.submit(client.post, "/generate", json=body)
            wait_for(lambda h: h["running"], "the first request to run", client)
            sock = post_raw(served.url, body)
            wait_for(lambda h: h["queue"] == 1, "the second request to wait", client)
            leave(sock)
            wait_for(lambda h: h["queue"] == 0, "the waiting request to be cancelled", client)
            gated_steps.set()
            assert first.result(TIMEOUT).status_code == 200
        assert client.post("/generate", json=body).json()["request"] == 2
        assert [s.run for s in served.worker.summaries] == [0, 2]  # request 1 never ran


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
