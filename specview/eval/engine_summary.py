"""The summary of an eval against a serving endpoint (`eval --endpoint`): the same keys as summary.py's, from the
engine's per-request counters instead of our steps. What an engine does not report is null, never guessed:

  acceptance_rate         sum(accepted) / sum(drafted) over the requests (llama-server: draft_n_accepted / draft_n)
  steps, τ                target forwards = tokens - accepted (each forward emits one token of its own plus the
                          drafts it accepted), τ = tokens / forwards
  per_position_acceptance accepted at position i / verification steps with drafts, where /metrics exports them
  tokens_per_s            tokens / wall time of the requests as this client saw them (prefill and HTTP included);
                          engine_tokens_per_s: the engine's own generation rate (llama-server's predicted_ms)
  speedup                 against --baseline-endpoint, per prompt, as for our own engine; null without one
  early_stops             requests that ended before N tokens (end-of-sequence, or an empty text: `stop` of each
                          result); where there are any, tokens/s and τ cover those few tokens (the table says so)
alpha, the cost ratios and the predicted speedups need per-step verdicts and timings no engine exports: null."""

from __future__ import annotations

from specview.core.events import nonfinite_to_none
from specview.core.metrics import ratio, speedups_over_baseline
from specview.eval.categories import baseline_summary

ENGINE_POLICY = "engine"  # the engine decides how much it drafts: no --draft-policy of ours applies


def _sum(results: list[dict], key: str) -> int | float | None:
    values = [r.get(key) for r in results]
    return None if not values or any(v is None for v in values) else sum(values)


def _per_position(results: list[dict]) -> list[float | None]:
    rs = [r for r in results if r.get("accepted_per_position") is not None and r.get("drafts") is not None]
    if not rs or len(rs) < len(results):
        return []  # not reported for every request: no figure rather than a part
    n = max(len(r["accepted_per_position"]) for r in rs)
    drafts = sum(r["drafts"] for r in rs)
    return [ratio(sum((r["accepted_per_position"] + [0] * n)[i] for r in rs), drafts) for i in range(n)]


def early_stops(results: list[dict]) -> int | None:
    """How many requests ended before N tokens; None for a document written before requests were marked."""
    if any("stop" not in r for r in results):
        return None
    return sum(r["stop"] != "length" for r in results)


def baseline_metrics(results: list[dict]) -> dict:
    tokens, wall = _sum(results, "tokens") or 0, _sum(results, "wall_s") or 0.0
    return nonfinite_to_none({"prompts": len(results), "tokens": tokens, "steps": tokens, "wall_s": wall,
                              "early_stops": early_stops(results),
                              "tokens_per_s": ratio(tokens, wall),
                              "engine_tokens_per_s": _engine_rate(results), "target_ms_per_token": None})


def _engine_rate(results: list[dict]) -> float | None:
    ms = _sum(results, "engine_gen_ms")
    return ratio(_sum(results, "tokens"), ms / 1000 if ms is not None else None)


def group_metrics(results: list[dict], baseline: dict[str, dict]) -> dict:
    tokens, wall = _sum(results, "tokens") or 0, _sum(results, "wall_s") or 0.0
    drafted, accepted = _sum(results, "drafted"), _sum(results, "accepted")
    steps = tokens - accepted if accepted is not None else None
    drafts = _sum(results, "drafts")
    pairs = [(baseline[r["prompt_id"]]["tokens"], baseline[r["prompt_id"]]["wall_s"], r["tokens"], r["wall_s"])
             for r in results if r["prompt_id"] in baseline]
    mean_speedup, total_speedup = speedups_over_baseline(pairs) if pairs else (None, None)
    same = [r.get("same_tokens") for r in results]
    return nonfinite_to_none({
        "prompts": len(results), "tokens": tokens, "steps": steps, "wall_s": wall,
        "early_stops": early_stops(results), "drafted": drafted, "accepted": accepted, "drafts": drafts,
        "acceptance_rate": ratio(accepted, drafted),
        "alpha": None,
        "mean_accepted_tokens": ratio(tokens, steps),  # tau
        "mean_accepted_per_draft": ratio(accepted, drafts),  # accepted drafts per verification step with drafts
        "drafted_per_step": ratio(drafted, drafts),
        "accepted_length_histogram": [],
        "per_position_acceptance": _per_position(results),
        "conditional_position_acceptance": [],
        "tokens_per_s": ratio(tokens, wall),
        "engine_tokens_per_s": _engine_rate(results),
        "speedup_mean_of_prompts": mean_speedup,
        "speedup_total_time": total_speedup,
        "expected_tokens_per_step": None, "predicted_speedup": None, "theoretical_speedup": None,
        "target_ms_per_token": None, "cost_ratio": None, "verify_cost_ratio": None,
        "same_tokens_failures": None if all(s is None for s in same) else
        [r["prompt_id"] for r in results if r.get("same_tokens") is False],
    })


def summarize(doc: dict) -> dict:
    """{"autoregressive": the baseline endpoint (empty without one), "<engine label>": {"overall", "by_category",
    "drafter", "policy"}}, categories in the order of the prompt set."""
    results = doc["results"]
    baseline, by_category, summary = baseline_summary(doc, baseline_metrics)
    for label in doc["config"]["drafters"]:
        mine = [r for r in results if r["method"] == "speculative" and r["drafter"] == label]
        summary[label] = {"overall": group_metrics(mine, baseline),
                          "by_category": by_category(mine, lambda rs: group_metrics(rs, baseline)),
                          "drafter": label, "policy": ENGINE_POLICY}
    return summary
