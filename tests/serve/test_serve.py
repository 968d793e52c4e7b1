"""`specview serve` against a real uvicorn on a loopback port with tiny models: load from concurrent
clients, cancel on disconnect, the full queue, and the live /events stream. Nothing here waits on a
clock: each test waits for something it can observe (a record, a /health field), with generous timeouts."""

from __future__ import annotations

import json
import re
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx
from serve_helpers import TIMEOUT, running_server, stream_records, wait_for

from specview.serve.client import iter_sse


def metric(page: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{re.escape(name + labels)} (\S+)$", page, re.M)
    return float(match.group(1)) if match else 0.0


def test_load_from_16_clients_is_complete_identical_and_counted(settings):
    """200 requests from 16 concurrent clients, a quarter streamed: every answer complete, each one the same
    as that request alone (greedy, or sampled with a seed), and /metrics adds up to the summaries."""
    prompts = ["w1 w2 w3", "w4", "w5 w6", "w7 w8 w9 w10", "w3 w3", "w11 w12"]
    bodies = []
    for i in range(200):
        body = {"prompt": prompts[i % len(prompts)], "max_new_tokens": 4 + i % 5, "k": 1 + i % 4,
                "ignore_eos": True, "stream": i % 4 == 0}
        if i % 7 == 0:  # sampled, with its own seed: reproducible too
            body.update(temperature=0.8, seed=i % 3)
        else:
            body["temperature"] = 0.0
        bodies.append(body)

    def call(client, body):
        if body["stream"]:
            records = stream_records(client, "/generate", body)
            assert [r["type"] for r in records] == ["start"] + ["step"] * (len(records) - 2) + ["end"]
            return records[-1]
        response = client.post("/generate", json=body, timeout=TIMEOUT)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert answer["generated_ids"] == answer["summary"]["generated_ids"]
        return answer["summary"]

    with running_server(settings, queue_size=32) as served, httpx.Client(base_url=served.url) as client:
        alone = {}
        for body in bodies:  # each distinct request once, one at a time
            key = json.dumps({**body, "stream": False}, sort_keys=True)
            if key not in alone:
                alone[key] = call(client, {**body, "stream": False})["generated_ids"]
        with ThreadPoolExecutor(16) as pool:
            clients = [httpx.Client(base_url=served.url) for _ in range(16)]
            ends = list(pool.map(lambda ib: call(clients[ib[0] % 16], ib[1]), enumerate(bodies)))
            for c in clients:
                c.close()
        page = client.get("/metrics").text
        health = client.get("/health").json()

    assert len(ends) == 200 and all(e["stop_reason"] == "length" for e in ends)
    for body, end in zip(bodies, ends):
        assert len(end["generated_ids"]) == body["max_new_tokens"]
        assert end["generated_ids"] == alone[json.dumps({**body, "stream": False}, sort_keys=True)]
    assert len({e["request"] for e in ends}) == 200  # every request its own run
    total = {name: sum(e[name] for e in ends) for name in ("steps", "drafted", "accepted")}
    solo = list(served.worker.summaries)[: len(alone)]
    assert metric(page, "specview:request_success_total", '{finished_reason="length"}') == 200 + len(alone)
    assert metric(page, "specview:steps_total") == total["steps"] + sum(s.steps for s in solo)
    assert metric(page, "specview:spec_decode_num_draft_tokens_total") == total["drafted"] + sum(s.drafted for s in solo)
    assert metric(page, "specview:spec_decode_num_accepted_tokens_total") == total["accepted"] + sum(s.accepted for s in solo)
    generated = sum(len(e["generated_ids"]) for e in ends) + sum(len(s.generated_ids) for s in solo)
    assert metric(page, "specview:generation_tokens_total") == generated
    per_pos = sum(metric(page, "specview:spec_decode_num_accepted_tokens_per_pos_total", f'{{position="{i}"}}')
                  for i in range(4))
    assert per_pos == metric(page, "specview:spec_decode_num_accepted_tokens_total")
    assert metric(page, "specview:step_phase_seconds_count", '{phase="verify"}') == metric(page, "specview:steps_total")
    assert metric(page, "specview:num_requests_waiting") == 0 and health["queue"] == 0


def test_a_client_that_disconnects_mid_stream_cancels_its_request(settings):
    """The engine thread is held after it sent the third step until the server has seen the disconnect,
    so the cancel lands exactly at that step boundary; the next request is answered as usual."""
    with running_server(settings) as served, httpx.Client(base_url=served.url) as client:
        send = served.worker._send

        def send_then_hold(job, record, publish=True):
            send(job, record, publish)
            if record["type"] == "step" and record["step"] == 2 and job.request.max_new_tokens == 100:
                job.cancelled.wait(TIMEOUT)  # what the engine thread does next depends only on the cancel

        served.worker._send = send_then_hold
        body = {"prompt": "w1 w2", "max_new_tokens": 100, "k": 1, "ignore_eos": True, "stream": True}
        with client.stream("POST", "/generate", json=body, timeout=TIMEOUT) as r:
            seen = []
            for _, record in iter_sse(r.iter_lines()):
                seen.append(record["type"])
                if seen.count("step") == 3:
                    break  # leave mid-stream: the connection closes here
        health = wait_for(lambda h: not h["running"], "the cancelled request to end", client)
        assert health["queue"] == 0
        [summary] = served.worker.summaries
        assert summary.stop_reason == "cancelled" and summary.steps == 3
        answer = client.post("/generate", json={"prompt": "w1 w2", "max_new_tokens": 5, "ignore_eos": True})
        assert answer.status_code == 200 and len(answer.json()["generated_ids"]) == 5
        page = client.get("/metrics").text
        assert metric(page, "specview:request_success_total", '{finished_reason="cancelled"}') == 1


def test_a_full_queue_answers_503_with_retry_after(settings, monkeypatch):
    from specview.engine.decoder import Run

    real_step = Run.step
    gate = threading.Event()

    def gated(self):
        gate.wait(TIMEOUT)
        return real_step(self)

    monkeypatch.setattr(Run, "step", gated)
    with running_server(settings, queue_size=1) as served, httpx.Client(base_url=served.url) as client:
        body = {"prompt": "w1", "max_new_tokens": 3}
        with ThreadPoolExecutor(2) as pool:
            first = pool.submit(client.post, "/generate", json=body, timeout=TIMEOUT)
            wait_for(lambda h: h["running"], "the first request to run", client)
            second = pool.submit(client.post, "/generate", json=body, timeout=TIMEOUT)
            wait_for(lambda h: h["queue"] == 1, "the second request to wait", client)
            third = client.post("/generate", json=body)
            assert third.status_code == 503 and int(third.headers["retry-after"]) >= 1
            assert "queue is full" in third.json()["error"]
            gate.set()
            assert first.result().status_code == 200 and second.result().status_code == 200
        assert client.post("/generate", json=body).status_code == 200


def test_events_streams_every_record_and_replays_after_a_reconnect(settings):
    with running_server(settings) as served, httpx.Client(base_url=served.url) as client:
        got: list = []
        subscribed = threading.Event()

        def watch():
            with client.stream("GET", "/events", timeout=TIMEOUT) as r:
                subscribed.set()
                for event_id, record in iter_sse(r.iter_lines()):
                    got.append((int(event_id), record))
                    if record["type"] == "end" and record["request"] == 1:
                        return

        watcher = threading.Thread(target=watch)
        watcher.start()
        assert subscribed.wait(TIMEOUT)
        wait_for(lambda h: True, "the watcher", client)  # its subscription is in place once its response began
        answers = [client.post("/generate", json={"prompt": p, "max_new_tokens": 4, "ignore_eos": True}).json()
                   for p in ("w1", "w2")]
        watcher.join(TIMEOUT)
        kinds = [(r["request"], r["type"]) for _, r in got]
        for a in answers:
            steps = a["summary"]["steps"]
            assert kinds.count((a["request"], "step")) == steps and (a["request"], "end") in kinds
        assert [i for i, _ in got] == sorted(i for i, _ in got)
        # a watcher that lost its connection after some id asks for the rest: nothing is lost
        middle = got[len(got) // 2][0]
        replay = []
        with client.stream("GET", "/events", headers={"Last-Event-ID": str(middle)}, timeout=TIMEOUT) as r:
            for event_id, record in iter_sse(r.iter_lines()):
                replay.append((int(event_id), record))
                if int(event_id) == got[-1][0]:
                    break
        assert replay == [item for item in got if item[0] > middle]


def test_per_position_counters_count_only_drafted_positions(settings):
    """Under p-min a step drafts fewer than K (none at all when the first draft token is below the cut-off):
    the per-position counters count the positions drafted, never K per step, and the stops are counted by
    reason, matching the streamed step records."""
    settings.draft_policy = "p-min=0.1"
    with running_server(settings) as served, httpx.Client(base_url=served.url) as client:
        steps = []
        for prompt in ("w1 w2 w3", "w4 w5", "w6"):
            records = stream_records(client, "/generate", {"prompt": prompt, "max_new_tokens": 10, "k": 4,
                                                           "ignore_eos": True, "stream": True})
            steps += [r for r in records if r["type"] == "step"]
        page = client.get("/metrics").text
    lengths = [len(s["drafted"]) for s in steps]
    assert {s["policy"] for s in steps} == {"p-min=0.1"}
    assert any(n < 4 and s["stopped_by"] == "p-min" for n, s in zip(lengths, steps)), "p-min must cut here"
    assert any(n > 0 for n in lengths), "and draft"
    for i in range(4):
        drafted = metric(page, "specview:spec_decode_num_draft_tokens_per_pos_total", f'{{position="{i}"}}')
        assert drafted == sum(n > i for n in lengths)
    assert metric(page, "specview:spec_decode_num_drafts_total") == sum(n > 0 for n in lengths) < len(steps) * 4
    assert metric(page, "specview:spec_decode_num_draft_tokens_total") == sum(lengths)
    for reason in ("budget", "p-min", "no-proposal"):
        assert metric(page, "specview:spec_decode_draft_stops_total", f'{{policy="p-min=0.1",reason="{reason}"}}') \
            == sum(s["stopped_by"] == reason for s in steps)
