"""`specview --attach URL`: the TUI on a remote `specview serve`, behind the same Backend interface as the
child-process engine (tui/process.py), and drawing the same records with the same conversion
(`backend.views.step_view`): the server's step records are the engine stream's.

Two modes:
  requests (default)  space / r show the next step of a generation the server runs with the TUI's
                      settings (POST /generate, stream: true); the first step of a run sends the request.
                      K changes (+/-) and d apply to the next request: a request runs whole on the server.
  follow (--follow)   the steps of every request anyone sends, from GET /events; n moves to the next one.

A dropped connection is one line on the status line; the client retries with backoff and resumes on
/events after the last record id it saw (Last-Event-ID), so it loses no step the server sent. (A dropped
/generate stream also cancels that request on the server, at its next step: it ends "cancelled".)
No profile is written here: the server writes the session's profile when it stops."""

from __future__ import annotations

import queue
import threading

import httpx

from specview.backend.base import RemoteBackend
from specview.backend.views import RunInfo, SessionInfo, StepView, step_view
from specview.core.errors import SpecviewError
from specview.serve.client import iter_sse

CONNECT_S = 10.0  # connecting and each read of a header; a stream itself may stay quiet for long
BACKOFF_S = (0.5, 1, 2, 4, 8)  # waits between retries after a dropped connection (then 8 s each)
POLL_S = 0.2  # how often a waiting step() looks whether the app is leaving
LOADING_POLL_S = 0.5  # how often load() asks a server that is still loading its models


class AttachBackend(RemoteBackend):
    def __init__(self, url: str, token: str | None, settings, follow: bool = False):
        super().__init__(settings.target, settings.draft, settings.k, settings.temperature)
        self.url = url.rstrip("/")
        self.settings = settings
        self.follow = follow
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.client = httpx.Client(base_url=self.url, headers=self.headers,
                                   timeout=httpx.Timeout(CONNECT_S, read=None))
        self.inbox: queue.Queue = queue.Queue()  # records of the run on screen, from a reader thread
        self.sent = False  # the run's request has been sent (requests mode)
        self.steps = 0
        self.run_done = False
        self.run_index = 0
        self.current: int | None = None  # the server's id of the request on screen
        self.drafters: list[str] = []
        self.notice = ""  # one line for the status line: a dropped connection, a retry
        self.drops = 0  # connections lost so far
        self.leaving = threading.Event()
        self.info: SessionInfo | None = None

    # Backend ---------------------------------------------------------------------------------------

    def load(self, on_progress):
        on_progress(f"asking {self.url}/health")
        health = self._health()
        while health.get("status") == "loading" and not self.leaving.is_set():  # it answers before its models load
            on_progress(f"{self.url} is loading its models: {health.get('loading')}")
            self.leaving.wait(LOADING_POLL_S)
            health = self._health()
        if health.get("status") == "error":
            raise SpecviewError(f"the server at {self.url} failed to load its models: {health.get('error')}")
        self.drafters = health.get("drafters") or []
        if self.settings.draft in self.drafters:
            self.draft = self.settings.draft
        else:  # the TUI's default draft means nothing to a server that loaded others: take its first
            self.draft = self.drafters[0] if self.drafters else "autoregressive"
        self.target = health["target"]
        info = SessionInfo(
            target=self.target, draft=self.draft, device=f"{health.get('device')} at {self.url}",
            temperature=self.temperature, max_new_tokens=self.settings.max_new_tokens,
            prompt_text="(following the server)" if self.follow else self.settings.prompt,
            t_ar_ms=health.get("t_ar_ms"), load_s=health.get("load_s") or 0.0, drafters=self.drafters,
            roofline=health.get("roofline"),
        )
        if self.follow:
            self._reader(self._follow, self.inbox)
        self.info = info
        return info, RunInfo(self.run_index)

    def _health(self) -> dict:
        """/health's JSON: 200 when it serves, 503 with the same JSON while it loads, after a failed load or while
        it stops (its status says which); any other answer is no specview server."""
        try:
            response = self.client.get("/health")
            health = response.json()
        except (httpx.HTTPError, ValueError) as err:
            raise SpecviewError(f"cannot reach a specview server at {self.url}: {err}") from None
        if response.status_code not in (200, 503) or not isinstance(health, dict) or "status" not in health:
            raise SpecviewError(f"no specview server at {self.url}: GET /health answered {response.status_code}")
        return health

    def step(self) -> StepView:
        if not self.follow and not self.sent:
            self.sent = True
            self._reader(self._request, self.inbox)
        while True:
            record = self._next()
            kind, request = record["type"], record.get("request")
            if kind == "start":
                self.current = request
                if self.follow:  # the app draws this info: the prompt on screen is the request's
                    self.info.prompt_text = record.get("prompt") or ""
            elif kind == "step":
                self.current = request if self.current is None else self.current
                self.steps += 1
                self.run_done = record.get("stop_reason") is not None
                return step_view(record)
            elif kind == "end" and request == self.current and not self.run_done:
                self.run_done = True  # ended without a last step saying why: cancelled or interrupted
                raise SpecviewError(f"the server ended request {request}: {record['stop_reason']}")
            elif kind == "error":
                self.run_done = True
                raise SpecviewError(record.get("error") or "the server failed")

    def new_run(self) -> RunInfo:
        with self.lock:
            if not self.follow:
                self.inbox = queue.Queue()  # the old reader sees it is no longer wanted and leaves
                self.sent = False
            self.steps, self.run_done, self.current = 0, False, None
            self.run_index += 1
            return RunInfo(self.run_index)

    def next_drafter(self) -> str:
        if len(self.drafters) > 1:
            self.draft = self.drafters[(self.drafters.index(self.draft) + 1) % len(self.drafters)]
        return self.draft

    def _save(self, final: bool) -> str | None:
        if final:
            self.leaving.set()
        return None  # the server writes the session's profile

    def close(self) -> None:
        self.leaving.set()
        self.inbox = queue.Queue()
        self.client.close()

    # the reader threads ----------------------------------------------------------------------------

    def _next(self) -> dict:
        inbox = self.inbox
        while not self.leaving.is_set():
            try:
                return inbox.get(timeout=POLL_S)
            except queue.Empty:
                continue
        raise SpecviewError("detached")

    def _reader(self, target, inbox) -> None:
        threading.Thread(target=target, args=(inbox,), daemon=True, name="specview-attach").start()

    def _wanted(self, inbox) -> bool:
        return inbox is self.inbox and not self.leaving.is_set()

    def _request(self, inbox) -> None:
        """Send this run's request and pass its records on; resume on /events if the stream drops."""
        s = self.settings
        body = {"prompt": s.prompt, "max_new_tokens": s.max_new_tokens, "k": self.k, "temperature": s.temperature,
                "top_k": s.top_k, "top_p": s.top_p, "chat": s.chat, "ignore_eos": s.ignore_eos, "stream": True}
        if self.draft in self.drafters:
            body["draft"] = self.draft
        else:
            body["method"] = "autoregressive"
        last_id = request = None
        try:
            with self.client.stream("POST", "/generate", json=body) as response:
                if _refused(response, inbox):
                    return
                for event_id, record in iter_sse(response.iter_lines()):
                    if not self._wanted(inbox):
                        return  # a new run: leaving closes the stream, and the server cancels the request
                    last_id, request = event_id, record.get("request")
                    inbox.put(record)
                    if record["type"] in ("end", "error"):
                        return
        except httpx.HTTPError as err:
            if request is None:
                inbox.put({"type": "error", "error": f"cannot send the request to {self.url}: {err}"})
                return
            self.drops += 1
            self.notice = f"connection lost ({type(err).__name__}); resuming request {request}"
        self._watch(inbox, last_id, only=request)

    def _follow(self, inbox) -> None:
        self._watch(inbox, None, only=None)

    def _watch(self, inbox, last_id: str | None, only: int | None) -> None:
        """/events from after `last_id`, reconnecting with backoff; only request `only` (None: all)."""
        attempt = 0
        while self._wanted(inbox):
            headers = {"Last-Event-ID": last_id} if last_id is not None else {}
            try:
                with self.client.stream("GET", "/events", headers=headers) as response:
                    if _refused(response, inbox):
                        return
                    self.notice, attempt = "", 0
                    for event_id, record in iter_sse(response.iter_lines()):
                        if not self._wanted(inbox):
                            return
                        last_id = event_id
                        if only is None or record.get("request") == only:
                            inbox.put(record)
                            if only is not None and record["type"] in ("end", "error"):
                                return
            except httpx.HTTPError as err:
                self.drops += 1
                wait = BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]
                self.notice = f"connection to {self.url} lost ({type(err).__name__}); retrying in {wait:g} s"
                attempt += 1
                if self.leaving.wait(wait):
                    return


def _refused(response: httpx.Response, inbox) -> bool:
    """An answer other than 200 ends the stream: the server's error, in one line, goes to the inbox as an error
    record (its `error` field when the body is specview's JSON, else the body's start)."""
    if response.status_code == 200:
        return False
    response.read()
    try:
        line = f"{response.status_code}: {response.json()['error']}"
    except (ValueError, KeyError):
        line = f"{response.status_code}: {response.text[:200]}"
    inbox.put({"type": "error", "error": line})
    return True
