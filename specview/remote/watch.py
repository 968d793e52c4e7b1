"""What `specview --attach URL` shows of a serving engine: its speculation from its counters (polled /metrics) or
from the requests the TUI sends (llama-server's timings). An engine exports counts, not distributions: no token's
p and q, no per-step verdict; the figures here are the ones its counters define. No textual."""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

import httpx

from specview.core.errors import SpecviewError
from specview.core.metrics import ratio
from specview.remote.endpoint import Endpoint, probe
from specview.remote.prometheus import SpecCounters

NO_P_Q = ("this engine exports counts, not distributions: no per-token p and q, no per-step verdicts; "
          "acceptance, per position and tokens per step come from its counters")


@dataclass
class Figures:
    """Acceptance over some span (the whole server life, the last poll, or one request)."""

    source: str  # "metrics since start", "metrics, last Ns", "request"
    drafted: int | None = None
    accepted: int | None = None
    drafts: int | None = None
    per_position: list[float | None] = field(default_factory=list)
    tokens: int | None = None
    seconds: float | None = None
    text: str = ""
    stop: str | None = None  # a request's: "length" (N tokens), or "eos" / "empty" when it ended early

    @property
    def early(self) -> str | None:
        """The warning a request that ended before N tokens needs: its figures cover its few tokens only."""
        if self.stop in (None, "length"):
            return None
        said = "an empty text" if self.stop == "empty" else f"end-of-sequence after {self.tokens} tokens"
        return (f"the request ended early ({said}): its acceptance, tokens per step and tokens/s cover those tokens "
                "only (--ignore-eos for N tokens)")

    @property
    def acceptance_rate(self) -> float | None:
        return ratio(self.accepted, self.drafted)

    @property
    def tokens_per_step(self) -> float | None:
        """tokens / target forwards, a forward emitting one token of its own plus the drafts it accepted."""
        if self.tokens is None or self.accepted is None:
            return None
        return ratio(self.tokens, self.tokens - self.accepted)

    @property
    def tokens_per_s(self) -> float | None:
        return ratio(self.tokens, self.seconds)


def from_counters(c: SpecCounters, source: str, seconds: float | None) -> Figures:
    return Figures(source, c.draft_tokens, c.accepted, c.drafts, [ratio(a, c.drafts) for a in c.per_position],
                   c.generated, seconds)


def is_specview_server(url: str) -> bool:
    """A `specview serve` answers /health with its target and drafters."""
    try:
        health = httpx.get(url.rstrip("/") + "/health", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return False
    return isinstance(health, dict) and "drafters" in health and "target" in health


def open_engine(url: str) -> Endpoint:
    """The engine behind --attach URL; one line when it is not one specview can watch."""
    endpoint = probe(url, need_speculation=False, what="--attach")
    if endpoint.kind == "openai":
        endpoint.close()
        raise SpecviewError(f"--attach: {url} is neither a specview server nor llama-server nor vLLM (an "
                            "OpenAI-compatible server that reports no speculation)")
    return endpoint


class EngineWatch:
    """The figures of one engine: poll() reads /metrics (the whole life of the server, and the span since the
    last poll), request() sends the TUI's prompt and reads the answer's own counts."""

    def __init__(self, endpoint: Endpoint, settings):
        self.endpoint, self.settings = endpoint, settings
        self.last: tuple[float, SpecCounters] | None = None

    def poll(self) -> tuple[Figures, Figures | None] | None:
        """(since the server started, since the last poll, None on the first), or None without /metrics."""
        now, counters = time.monotonic(), self.endpoint.counters()
        if counters is None:
            return None
        recent = None
        if self.last is not None:
            then, before = self.last
            try:
                recent = from_counters(counters.minus(before), f"last {now - then:.0f} s", now - then)
            except SpecviewError:  # the server restarted: start over
                recent = None
        self.last = (now, counters)
        return from_counters(counters, "since the server started", None), recent

    def request(self) -> Figures:
        """The TUI's prompt, as eval --endpoint sends prompts: through the chat template with --chat, else as
        written with ignore_eos, so the request gives N tokens (an instruct model answers a raw prompt with
        end-of-sequence at once); an early end is marked all the same."""
        s = self.settings
        sent = replace(s, ignore_eos=bool(s.ignore_eos or not s.chat))
        done = self.endpoint.complete(s.prompt, sent, s.chat)
        per_pos = [ratio(a, done.drafts) for a in done.accepted_per_position or []]
        return Figures("request", done.drafted, done.accepted, done.drafts, per_pos, done.tokens,
                       done.wall_s, done.text, done.stop)
