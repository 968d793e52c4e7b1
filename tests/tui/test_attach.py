"""`specview --attach`: the TUI's backend on a real `specview serve` (no textual needed: the backend is
the engine side of the app). It gets the steps a request gets alone, follows other clients' requests,
loses no step when its connection drops, and waits for a server still loading its models."""

from __future__ import annotations

import threading

import httpx
import pytest
from serve_helpers import TIMEOUT, holding_the_load, running_server

import specview.tui.attach as attach
from specview.core.errors import SpecviewError
from specview.core.settings import Settings
from specview.tui.attach import AttachBackend


@pytest.fixture
def settings(gpt2_paths, tmp_path):
    return Settings(target=gpt2_paths[0], draft=gpt2_paths[1], prompt="w1 w2", max_new_tokens=9, k=2,
                    temperature=0.0, ignore_eos=True, threads=1, profile_dir=str(tmp_path / "profiles"))


def steps_until_done(backend) -> list:
    out = []
    while not backend.done:
        out.append(backend.step().step)
    return out


def test_space_sends_the_tuis_request_and_shows_its_steps(settings):
    with running_server(settings) as served, httpx.Client(base_url=served.url, timeout=TIMEOUT) as client:
        alone = client.post("/generate", json={"prompt": "w1 w2", "max_new_tokens": 9, "k": 2, "temperature": 0,
                                               "ignore_eos": True}).json()
        backend = AttachBackend(served.url, None, Settings(**{**settings.to_json(), "draft": "not-on-the-server"}))
        try:
            info, run = backend.load(lambda text: None)
            assert info.target == settings.target and info.drafters == [settings.draft] and run.index == 0
            assert backend.draft == settings.draft  # the server's drafter, not the TUI's default
            steps = steps_until_done(backend)
            assert [t for s in steps for t in s.emitted] == alone["generated_ids"]
            assert steps[-1].stop_reason == "length" and backend.steps_done == len(steps)
            assert all(s.k == 2 for s in steps)
            backend.set_k(3)  # K applies to the next request
            assert backend.new_run().index == 1 and not backend.done
            again = steps_until_done(backend)
            assert again[0].k == 3 and sum(len(s.emitted) for s in again) == 9
            assert backend.save(final=True) is None  # the server keeps the profile
        finally:
            backend.close()


def test_follow_shows_the_requests_other_clients_send(settings):
    with running_server(settings) as served, httpx.Client(base_url=served.url, timeout=TIMEOUT) as client:
        backend = AttachBackend(served.url, None, settings, follow=True)
        try:
            info, _ = backend.load(lambda text: None)
            got: list = []
            reader = threading.Thread(target=lambda: got.extend(steps_until_done(backend)))
            reader.start()
            # the watcher subscribes in load(); a request sent now is seen whole (and /events replays anyway)
            answer = client.post("/generate", json={"prompt": "w3", "max_new_tokens": 5, "ignore_eos": True}).json()
            reader.join(TIMEOUT)
            assert [t for s in got for t in s.emitted] == answer["generated_ids"]
            assert info.prompt_text == "w3"  # the screen shows the prompt of the request it follows
        finally:
            backend.close()


def test_a_dropped_stream_resumes_on_events_without_losing_a_step(settings, monkeypatch):
    """The /generate stream breaks after two steps (as a network would); the backend says so, picks up
    on /events after the last id it saw, and shows every step the server ran, in order, once. The server
    cancels the request it lost the client of (the engine is held after its fourth step until it notices: it ran 2 to 4)."""
    real_iter = attach.iter_sse

    def breaking(lines):
        records = real_iter(lines)
        for _ in range(3):  # start + 2 steps, then the connection "drops"
            yield next(records)
        raise httpx.ReadError("connection reset by peer")

    calls = []

    def iter_sse(lines):
        calls.append(1)
        return breaking(lines) if len(calls) == 1 else real_iter(lines)

    monkeypatch.setattr(attach, "iter_sse", iter_sse)
    with running_server(settings) as served:
        send = served.worker._send

        def send_then_hold(job, record, publish=True):
            send(job, record, publish)
            if record["type"] == "step" and record["step"] == 3:
                job.cancelled.wait(TIMEOUT)

        served.worker._send = send_then_hold
        backend = AttachBackend(served.url, None, Settings(**{**settings.to_json(), "max_new_tokens": 40}))
        try:
            backend.load(lambda text: None)
            steps = []
            with pytest.raises(SpecviewError, match="ended request 0: cancelled"):
                while True:
                    steps.append(backend.step().step)
            assert backend.drops == 1 and backend.notice == ""  # the line said it, and went once it resumed
            [summary] = served.worker.summaries
            assert summary.stop_reason == "cancelled"
            assert [s.step for s in steps] == list(range(summary.steps)) and summary.steps >= 2
            assert [t for s in steps for t in s.emitted] == summary.generated_ids
        finally:
            backend.close()


@pytest.mark.parametrize("follow", [False, True], ids=["request", "follow"])
def test_a_refused_token_is_the_servers_error_in_one_line(settings, follow):
    """Both streams (POST /generate, GET /events) end at an answer other than 200 with the server's own error,
    not a retry: a wrong token is not a dropped connection."""
    with running_server(settings, token="right") as served:
        backend = AttachBackend(served.url, "wrong", settings, follow=follow)
        try:
            backend.load(lambda text: None)  # /health needs no token
            with pytest.raises(SpecviewError, match=r"^401: missing or wrong token"):
                backend.step()
            assert backend.drops == 0 and backend.run_done
        finally:
            backend.close()


def test_attaching_to_a_server_still_loading_waits_for_its_models(settings, monkeypatch):
    """load() says the server is loading and returns once its models have loaded, with what they are."""
    said, loading_said = [], threading.Event()

    def progress(text):
        said.append(text)
        if "is loading its models: held by the test" in text:
            loading_said.set()

    with holding_the_load(monkeypatch) as held, running_server(settings, ready=False) as served:
        assert held.entered.wait(TIMEOUT)
        backend = AttachBackend(served.url, None, settings)
        got: list = []
        loader = threading.Thread(target=lambda: got.append(backend.load(progress)))
        try:
            loader.start()
            assert loading_said.wait(TIMEOUT), said
            assert not got  # still waiting: the models have not loaded
            held.release.set()
            loader.join(TIMEOUT)
            [(info, run)] = got
            assert info.device == f"cpu at {served.url}" and info.t_ar_ms is not None and run.index == 0
            assert served.worker is not None and served.state.status == "ok"
        finally:
            backend.close()


def test_attaching_to_a_server_whose_load_failed_says_why(settings, monkeypatch):
    def fails(settings, say):
        raise SpecviewError("cannot load nowhere")

    monkeypatch.setattr("specview.serve.loading.load_session", fails)
    with running_server(settings, ready=False) as served:  # load() waits while it loads, then sees the error
        backend = AttachBackend(served.url, None, settings)
        try:
            with pytest.raises(SpecviewError, match="failed to load its models: cannot load nowhere"):
                backend.load(lambda text: None)
        finally:
            backend.close()


def test_attaching_to_something_that_is_no_specview_server_says_so(settings, monkeypatch):
    """/health's 503 is a specview server loading or failed (its JSON says which); a 404 is no specview server."""
    def fails(settings, say):
        raise SpecviewError("cannot load nowhere")

    monkeypatch.setattr("specview.serve.loading.load_session", fails)
    with running_server(settings, ready=False) as served:
        backend = AttachBackend(served.url + "/elsewhere", None, settings)  # GET /elsewhere/health: 404
        try:
            with pytest.raises(SpecviewError, match="no specview server at .*answered 404"):
                backend.load(lambda text: None)
        finally:
            backend.close()
