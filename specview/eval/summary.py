"""An eval document's `summary`: the metrics per drafter, overall and per category, from its `results`
(docs/design/bench-and-eval.md "Eval"). Every definition comes from specview/core/metrics.py, the one home shared with run,
bench and the TUI; this module only groups results and rebuilds their counters. No torch: `report`
recomputes nothing, but tests and --resume rebuild summaries from the JSON alone."""

from __future__ import annotations

from collections.abc import Iterable

from specview.core.events import nonfinite_to_none
from specview.core.metrics import Counts, cost_model, ratio, speedups_over_baseline
from specview.eval.categories import AUTOREGRESSIVE, baseline_summary


def policies(config: dict) -> list[str]:
    """The draft-length policies an eval ran, in order (files from before `--draft-policy` ran `fixed`)."""
    return list(config.get("policies") or [config.get("draft_policy") or "fixed"])


def variant_label(spec: str, policy: str, first: str) -> str:
    """A drafter under a policy, as the summary keys it: the spec under the first policy (as before
    `--draft-policy` took a list), `spec [policy]` under each other one."""
    return spec if policy == first else f"{spec} [{policy}]"


def variants(config: dict) -> list[tuple[str, str, str]]:
    """(label, drafter spec, policy) for every drafter under every policy: drafters in the order of
    --draft, each under the policies in the order of --draft-policy."""
    ps = policies(config)
    return [(variant_label(d, p, ps[0]), d, p) for d in config["drafters"] for p in ps]


def result_policy(result: dict, config: dict) -> str | None:
    """A speculative result's policy (older files have none: the first); None for autoregressive."""
    if result["method"] == AUTOREGRESSIVE:
        return None
    return result.get("policy") or policies(config)[0]


def result_counts(results: Iterable[dict]) -> Counts:
    """The counters of whole runs, rebuilt from their per-step accepted and drafted lengths (a step with
    fewer accepted than drafted had a rejection: blocks are tested in order and stop at the first)."""
    counts = Counts()
    for r in results:
        for drafted, accepted in zip(r.get("drafted_lengths") or [], r.get("accepted_lengths") or []):
            counts.count(drafted, accepted, accepted < drafted, 0)
        if r["method"] == AUTOREGRESSIVE:  # one token per step, nothing drafted: no lengths stored
            counts.steps += r["steps"]
        counts.emitted += r["tokens"]
        counts.prefill_ms += r.get("prefill_ms") or 0.0
        counts.steps_ms += r["wall_s"] * 1000 - (r.get("prefill_ms") or 0.0)  # wall = the whole call
        for name, ms in (r.get("phases_ms") or {}).items():
            counts.phases_ms[name] = counts.phases_ms.get(name, 0.0) + ms
    return counts


def group_metrics(results: list[dict], baseline: dict[str, dict], k: int) -> dict:
    """The metrics of one drafter's results (a category, or all) against the autoregressive result of each
    of the same prompts (`baseline`: prompt id -> result)."""
    counts = result_counts(results)
    base = [baseline[r["prompt_id"]] for r in results if r["prompt_id"] in baseline]
    ar = result_counts(base)
    t_ar = ratio(ar.phases_ms.get("verify"), ar.steps)  # one-token target forward, prefill excluded
    costs = cost_model(counts, t_ar)
    alpha = counts.alpha
    e_k, predicted = costs.predicted(alpha, k)
    pairs = [(baseline[r["prompt_id"]]["tokens"], baseline[r["prompt_id"]]["wall_s"], r["tokens"], r["wall_s"])
             for r in results if r["prompt_id"] in baseline]
    mean_speedup, total_speedup = speedups_over_baseline(pairs)
    same = [r["same_tokens"] for r in results]
    positions = counts.per_position_acceptance
    conditional = counts.conditional_position_acceptance
    return nonfinite_to_none({
        "prompts": len(results),
        "tokens": counts.emitted,
        "steps": counts.steps,
        "wall_s": counts.wall_s,
        "acceptance_rate": counts.acceptance_rate,
        "alpha": alpha,
        "mean_accepted_tokens": counts.mean_emitted_per_step,  # tau
        "accepted_length_histogram": counts.accepted_length_histogram(k),
        "undrafted_steps": counts.steps - sum(counts.accepted_length_counts),  # n-gram misses: plain target steps
        "drafted_per_step": counts.drafted_per_step,  # below K under an adaptive policy (--draft-policy)
        "per_position_acceptance": positions + [None] * (k - len(positions)),
        "conditional_position_acceptance": conditional + [None] * (k - len(conditional)),
        "tokens_per_s": counts.tokens_per_s,
        "speedup_mean_of_prompts": mean_speedup,
        "speedup_total_time": total_speedup,
        "expected_tokens_per_step": e_k,  # E(K) from alpha
        "predicted_speedup": predicted,  # E(K) / (K c + v)
        "theoretical_speedup": costs.theoretical_speedup,  # tau / (K c + v), K as drafted
        "target_ms_per_token": t_ar,
        "cost_ratio": costs.c,
        "verify_cost_ratio": costs.v,
        "same_tokens_failures": None if all(s is None for s in same) else
        [r["prompt_id"] for r in results if r["same_tokens"] is False],
    })


def baseline_metrics(results: list[dict]) -> dict:
    counts = result_counts(results)
    return nonfinite_to_none({"prompts": len(results), "tokens": counts.emitted, "steps": counts.steps, "wall_s": counts.wall_s,
                   "tokens_per_s": counts.tokens_per_s,
                   "target_ms_per_token": ratio(counts.phases_ms.get("verify"), counts.steps)})


def summarize(doc: dict) -> dict:
    """{"autoregressive": {...}, "<drafter>": {"overall": {...}, "by_category": {"<cat>": {...}}, "drafter",
    "policy"}}, drafters in the order of --draft (with a list of policies, `<drafter> [<policy>]` for each but
    the first: variants()), categories in the order of the prompt set; only prompts with results count."""
    if doc["config"].get("engine"):  # an eval of a serving endpoint: the engine's counters, not our steps
        from specview.eval.engine_summary import summarize as summarize_endpoint

        return summarize_endpoint(doc)
    k = doc["config"]["k"]
    results = doc["results"]
    baseline, by_category, summary = baseline_summary(doc, baseline_metrics)
    config = doc["config"]
    for label, spec, policy in variants(config):
        mine = [r for r in results if r["method"] == "speculative" and r["drafter"] == spec
                and result_policy(r, config) == policy]
        summary[label] = {"overall": group_metrics(mine, baseline, k),
                          "by_category": by_category(mine, lambda rs: group_metrics(rs, baseline, k)),
                          "drafter": spec, "policy": policy}
    return summary
