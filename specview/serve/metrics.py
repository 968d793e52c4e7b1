"""GET /metrics: Prometheus text. Names follow vLLM's where the meaning is the same (`vllm:` becomes
`specview:`): spec_decode_num_drafts / _num_draft_tokens / _num_accepted_tokens / _per_pos, prompt and
generation tokens, requests waiting and running, request_success by finished_reason. The per-position
counters count drafted positions only (a draft-length policy leaves positions past its budget undrafted),
and spec_decode_draft_stops says why each step stopped drafting. A counter's
exported name ends in _total. Every count is added once per step or per finished request on the engine
thread, so the counters add up to the requests' summaries exactly."""

from __future__ import annotations

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from specview.core.phases import PHASES

# Step phases run from well under a millisecond (sample on a tiny model) to seconds (a big verify on CPU).
PHASE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
LATENCY_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
CONTENT_TYPE = CONTENT_TYPE_LATEST
disable_created_metrics()  # no `_created` timestamp series: half the page, and vLLM's pages have none


class ServeMetrics:
    def __init__(self):
        self.registry = r = CollectorRegistry()  # one per server: tests run several in one process
        self.requests = Counter("specview:request_success", "Finished requests by why they stopped",
                                ["finished_reason"], registry=r)
        self.rejected = Counter("specview:requests_rejected", "Requests answered with an error, by HTTP status",
                                ["status"], registry=r)
        self.prompt_tokens = Counter("specview:prompt_tokens", "Prompt tokens of the requests run", registry=r)
        self.generation_tokens = Counter("specview:generation_tokens", "Tokens generated", registry=r)
        self.steps = Counter("specview:steps", "Engine steps (target forwards)", registry=r)
        self.drafts = Counter("specview:spec_decode_num_drafts", "Steps that drafted at least one token", registry=r)
        self.draft_tokens = Counter("specview:spec_decode_num_draft_tokens", "Drafted tokens", registry=r)
        self.accepted_tokens = Counter("specview:spec_decode_num_accepted_tokens", "Accepted draft tokens", registry=r)
        # Per position, only positions actually drafted: under --draft-policy (p-min, heuristic, goodput) a step
        # drafts fewer than K, and a position past its budget was not drafted, so not rejected either. The
        # acceptance at a position is accepted_per_pos / draft_tokens_per_pos; vLLM's accepted_per_pos /
        # num_drafts assumes every step drafts every position, which an adaptive policy does not.
        self.drafted_per_pos = Counter("specview:spec_decode_num_draft_tokens_per_pos",
                                       "Drafted tokens by draft position (0 = first); positions a step did not "
                                       "draft are not counted", ["position"], registry=r)
        self.accepted_per_pos = Counter("specview:spec_decode_num_accepted_tokens_per_pos",
                                        "Accepted draft tokens by draft position (0 = first); divide by "
                                        "spec_decode_num_draft_tokens_per_pos, not num_drafts", ["position"],
                                        registry=r)
        self.stopped_by = Counter("specview:spec_decode_draft_stops",
                                  "Speculative steps by why drafting stopped: budget (the policy's budget or K was "
                                  "drafted), p-min (a draft token below the cut-off), no-proposal (the drafter had "
                                  "nothing more)", ["policy", "reason"], registry=r)
        self.phase_seconds = Histogram("specview:step_phase_seconds", "Time of each phase of a step",
                                       ["phase"], buckets=PHASE_BUCKETS, registry=r)
        self.latency = Histogram("specview:e2e_request_latency_seconds", "From queued to finished",
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.waiting = Gauge("specview:num_requests_waiting", "Requests in the queue", registry=r)
        self.running = Gauge("specview:num_requests_running", "Requests the engine is running (0 or 1)", registry=r)

    def step(self, step) -> None:
        """One StepResult, right after it ran."""
        n = len(step.drafted)
        self.steps.inc()
        self.generation_tokens.inc(len(step.emitted))
        if n:
            self.drafts.inc()
            self.draft_tokens.inc(n)
            self.accepted_tokens.inc(step.accepted)
        if step.stopped_by is not None:
            self.stopped_by.labels(step.policy or "fixed", step.stopped_by).inc()
        for i in range(n):  # drafted positions only: those past the step's budget were never drafted
            self.drafted_per_pos.labels(str(i)).inc()
            if i < step.accepted:
                self.accepted_per_pos.labels(str(i)).inc()
        for name in PHASES:
            ms = step.phases_ms.get(name)
            if isinstance(ms, (int, float)):
                self.phase_seconds.labels(name).observe(ms / 1000)

    def finished(self, reason: str, latency_s: float) -> None:
        self.requests.labels(reason).inc()
        self.latency.observe(latency_s)

    def render(self) -> bytes:
        return generate_latest(self.registry)
