"""`specview serve` answers before its models have loaded (docs/design/serve.md).

The socket listens and /health answers at once, while a thread loads the session: the models, t_ar and the engine
worker (its tokenizer copy, its profile recorder). Meanwhile /health says `"status": "loading"` and what the load
is doing, and every request that needs the engine gets 503 with Retry-After. A load that fails leaves the server
up to say why: /health `"status": "error"` with the message, and that message in a 503 to every request, until a
signal stops it. Nothing here imports torch: the server listens before torch is imported."""

from __future__ import annotations

from specview.core.draft_spec import parse_drafts
from specview.serve.schema import ApiError

LOADING_RETRY_S = 5  # Retry-After while the models load: a guess (/health says what the load is doing)


def load_session(settings, say):
    """The load (on the loading thread) -> (session, t_ar_ms): the session starts on the forward it has (a compiled
    one is built in the background), and t_ar is timed once (the profile's c and v use it, no request waits)."""
    from specview.profiling.target_token_time import time_target_token
    from specview.session import open_session

    session = open_session(settings, say, background=True)
    return session, time_target_token(session.decoder("autoregressive"), session.prompt_ids)


def drafter_specs(settings) -> list[str]:
    """The drafters `settings` asks for, checked as open_session checks them: a bad spec fails before the socket
    listens, as it did when the load came first."""
    return [spec.text for spec in parse_drafts(settings.draft)]


def server_info(settings, cap: int, session=None, t_ar_ms: float | None = None, roofline=None) -> dict:
    """What /health says the server serves: from the settings while loading (what will load), then from the
    session. The same keys either way; what only the load can tell is None until then."""
    s = session.settings if session is not None else settings
    return {"target": session.target.spec if session else s.target,
            "drafters": [d.spec for d in session.drafters] if session else drafter_specs(s),
            "device": str(session.device) if session else None, "t_ar_ms": t_ar_ms,
            "load_s": session.load_s if session else None,
            "roofline": roofline,  # bandwidth, bytes per forward: the TUI's floors
            "max_new_tokens_cap": cap,
            "defaults": {"max_new_tokens": min(s.max_new_tokens, cap), "k": s.k, "temperature": s.temperature,
                         "top_k": s.top_k, "top_p": s.top_p, "ignore_eos": s.ignore_eos}}


class Readiness:
    """Where the server stands: "loading", "ok" (the engine worker exists) or "error". Changed on the event loop's
    thread only, but for `loading`, the load's last progress line (one attribute the loading thread writes)."""

    def __init__(self, info: dict):
        self.status = "loading"
        self.loading: str | None = "starting"
        self.error: str | None = None
        self.worker = None
        self.info = info

    def ready(self, worker, info: dict) -> None:
        self.worker, self.info = worker, info
        self.status, self.loading = "ok", None

    def failed(self, message: str) -> None:
        self.status, self.loading, self.error = "error", None, message

    def engine(self):
        """The engine worker, or ApiError 503: still loading (with Retry-After), or the load failed."""
        if self.worker is not None:
            return self.worker
        if self.status == "error":
            raise ApiError(503, f"the models failed to load: {self.error}")
        raise ApiError(503, f"the models are loading ({self.loading}); retry later (GET /health says when ready)",
                       headers={"Retry-After": str(LOADING_RETRY_S)})

    @property
    def drafters(self) -> list[str]:
        return list(self.worker.drafters) if self.worker is not None else self.info["drafters"]

    def health(self, stopping: bool) -> dict:
        worker = self.worker
        return {"status": "stopping" if stopping else self.status, "loading": self.loading, "error": self.error,
                **self.info, "queue": worker.waiting if worker else 0,
                "running": worker is not None and worker.running is not None}
