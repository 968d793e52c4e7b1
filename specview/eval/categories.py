"""What every summary of an eval file starts from: its results by category, in the prompt set's order."""

from __future__ import annotations

AUTOREGRESSIVE = "autoregressive"  # the summary's key for the baseline (drafter specs key the others)


def baseline_summary(doc: dict, baseline_metrics) -> tuple[dict, object, dict]:
    """(the autoregressive results by prompt id, by_category(results, metrics) -> {category: metrics} in the prompt
    set's order over the categories that have results, the summary's autoregressive entry, by `baseline_metrics`): what
    every summary of an eval file starts from (ours, summary.py; a serving engine's, engine_summary.py)."""
    category = {p["id"]: p["category"] for p in doc["prompts"]}
    order = list(dict.fromkeys(p["category"] for p in doc["prompts"]))
    baseline = {r["prompt_id"]: r for r in doc["results"] if r["method"] == AUTOREGRESSIVE}

    def by_category(rs: list[dict], metrics) -> dict:
        return {c: metrics([r for r in rs if category.get(r["prompt_id"]) == c]) for c in order
                if any(category.get(r["prompt_id"]) == c for r in rs)}

    ar = list(baseline.values())
    return baseline, by_category, {AUTOREGRESSIVE: {"overall": baseline_metrics(ar),
                                                    "by_category": by_category(ar, baseline_metrics)}}
