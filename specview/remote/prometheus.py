"""Prometheus' text exposition format, as far as speculative decoding needs it: the counters that vLLM and
llama-server export for their drafts, read before and after a request and differenced.

vLLM (its metrics documentation): `vllm:spec_decode_num_drafts`, `vllm:spec_decode_num_draft_tokens`,
`vllm:spec_decode_num_accepted_tokens` and `vllm:spec_decode_num_accepted_tokens_per_pos{position}`, counters that
prometheus_client writes with a `_total` suffix (and `_created` samples beside them), one series per label set
(model_name, engine): they are summed over every label but `position`. llama-server (`--metrics`) writes the same
names under `llamacpp:` with `_total`, and `position` counted from 0 as vLLM does."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from specview.core.errors import SpecviewError

PREFIXES = ("vllm:", "llamacpp:")  # the engines whose draft counters are known
COUNTERS = {"spec_decode_num_drafts": "drafts", "spec_decode_num_draft_tokens": "draft_tokens",
            "spec_decode_num_accepted_tokens": "accepted"}
PER_POSITION = "spec_decode_num_accepted_tokens_per_pos"
GENERATED = ("generation_tokens", "tokens_predicted")  # vLLM's, llama-server's generated-token counters

_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+\S+)?$')
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Every sample line -> (name, labels, value); comments (# HELP, # TYPE) and blank lines skipped. A line
    that is not a sample is a SpecviewError naming it: a /metrics that is not Prometheus' format."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m is None:
            raise SpecviewError(f"/metrics line {n} is not a Prometheus sample: {line[:80]!r}")
        labels: dict[str, str] = {}
        rest = m.group("labels") or ""
        pos = 0
        while pos < len(rest):
            lm = _LABEL.match(rest, pos)
            if lm is None or lm.end() == pos:
                raise SpecviewError(f"/metrics line {n} has labels that are not Prometheus': {line[:80]!r}")
            labels[lm.group(1)] = lm.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            pos = lm.end()
        try:
            value = float(m.group("value"))  # also +Inf, -Inf, NaN
        except ValueError:
            raise SpecviewError(f"/metrics line {n} has no number: {line[:80]!r}") from None
        out.append((m.group("name"), labels, value))
    return out


@dataclass
class SpecCounters:
    """An engine's draft counters at one moment (or the difference of two moments): drafts = verification
    steps that had drafts, draft_tokens = tokens drafted, accepted = drafts accepted, per_position[i] = drafts
    accepted at position i + 1; generated = tokens generated (None when the engine does not export it)."""

    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)
    generated: int | None = None

    def minus(self, before: SpecCounters) -> SpecCounters:
        """The counts between two readings; a counter that went down (the engine restarted) is an error."""
        pos = [a - (before.per_position[i] if i < len(before.per_position) else 0)
               for i, a in enumerate(self.per_position)]
        out = SpecCounters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                           self.accepted - before.accepted, pos,
                           None if self.generated is None or before.generated is None
                           else self.generated - before.generated)
        if min([out.drafts, out.draft_tokens, out.accepted, *pos]) < 0:
            raise SpecviewError("the engine's draft counters went down between two readings (was it restarted?)")
        return out

    def to_json(self) -> dict:
        return {"drafts": self.drafts, "draft_tokens": self.draft_tokens, "accepted": self.accepted,
                "accepted_per_position": list(self.per_position), "generated": self.generated}


def _base(name: str) -> tuple[str, str] | None:
    """'vllm:spec_decode_num_drafts_total' -> ('vllm:', 'spec_decode_num_drafts'); None for other names and for
    prometheus_client's `_created` timestamps."""
    prefix = next((p for p in PREFIXES if name.startswith(p)), None)
    if prefix is None or name.endswith("_created"):
        return None
    base = name[len(prefix):]
    return prefix, base[: -len("_total")] if base.endswith("_total") else base


def engine_of(text: str) -> str | None:
    """'vllm' or 'llamacpp' when the exposition holds that engine's names, else None."""
    for name, _, _ in parse(text):
        hit = _base(name)
        if hit is not None:
            return hit[0][:-1]
    return None


def spec_counters(text: str) -> SpecCounters | None:
    """The draft counters of an exposition, summed over every label set (per position: by `position`); None
    when it has none of them (no speculation configured, or not an engine we know)."""
    counts = SpecCounters()
    per_pos: dict[int, float] = {}
    found = False
    generated = None
    for name, labels, value in parse(text):
        hit = _base(name)
        if hit is None or not math.isfinite(value):
            continue
        _, base = hit
        if base in COUNTERS:
            found = True
            setattr(counts, COUNTERS[base], getattr(counts, COUNTERS[base]) + int(value))
        elif base == PER_POSITION and "position" in labels:
            found = True
            i = int(labels["position"])
            per_pos[i] = per_pos.get(i, 0) + value
        elif base in GENERATED:
            generated = (generated or 0) + int(value)
    if not found:
        return None
    counts.per_position = [int(per_pos.get(i, 0)) for i in range(max(per_pos) + 1)] if per_pos else []
    counts.generated = generated
    return counts
