"""The eval document, `specview.eval/1` (docs/design/bench-and-eval.md "Eval"): its config, one result per (prompt,
method), the summary, and --resume's check that a file was written with the same settings. No torch."""

from __future__ import annotations

import math
import os
import time

from specview.core.errors import SpecviewError
from specview.core.events import nonfinite_to_none
from specview.core.file_schemas import EVAL_SCHEMA, load
from specview.core.policies import parse_policies
from specview.core.prompt_sets import Prompt, digest
from specview.core.settings import K_LIMIT, Settings
from specview.eval.summary import AUTOREGRESSIVE, result_policy, summarize, variants

# Settings a resumed eval must share with its file: each changes the tokens or the timings. (profile_dir,
# cache and the prompt set's path do not: the set is compared by its digest, so a moved file still resumes.)
RESUME_FIELDS = ("target", "draft", "draft_policy", "max_new_tokens", "k", "temperature", "top_k", "top_p", "seed", "ignore_eos",
                 "device", "threads", "chat", "prompt_set_sha256")


def eval_config(settings: Settings, args, prompts: list[Prompt], drafters: list[str]) -> dict:
    config = {k: v for k, v in settings.to_json().items() if k not in ("prompt", "profile_dir")}
    config.update(chat=args.chat, prompts=args.prompts, limit=args.limit, categories=args.categories,
                  prompt_set_sha256=digest(prompts), num_prompts=len(prompts), drafters=drafters,
                  policies=parse_policies(settings.draft_policy))
    return config  # chat None = not resolved yet (auto: known once the tokenizer is loaded)


def check_resume(path: str, old: dict, new: dict, fields=RESUME_FIELDS) -> None:
    """SpecviewError naming the first setting that differs (a None on our side = not known yet: skipped)."""
    for name in fields:
        if name == "chat" and new.get(name) is None:
            continue  # auto: compared once the tokenizer says what auto means
        was = old.get(name, "fixed" if name == "draft_policy" else None)  # files from before --draft-policy
        if was != new.get(name):
            if name == "prompt_set_sha256":
                raise SpecviewError(f"--resume {path} was written for another prompt set (the file, --limit or "
                                    "--categories differ); give the same ones, or start a new eval")
            raise SpecviewError(f"--resume {path} was written with {name} {was!r}, this eval has "
                                f"{new.get(name)!r}; use the same settings, or start a new eval")


def load_resume(path: str, config: dict) -> dict:
    """The document to continue, checked against this eval's config (before any model loads)."""
    _, doc = load(path)
    if doc["schema"] != EVAL_SCHEMA:
        raise SpecviewError(f"--resume {path} is a {doc['schema']} file, not an eval ({EVAL_SCHEMA})")
    check_resume(path, doc["config"], config)
    problem = damage(doc)
    if problem:  # found now, not after the models load (or, worse, after the run, in the summary)
        raise SpecviewError(f"--resume {path} is damaged: {problem}; start a new eval (or repair the file)")
    return doc


# No count specview writes comes near it; past it an int has no float (10**400 / 2 raises OverflowError), and the
# summary divides counts and seconds: such a file would fail only once the models had loaded and the run was done.
COUNT_LIMIT = 2**63


def _count(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 0 <= v < COUNT_LIMIT


def _seconds(v) -> bool:
    if isinstance(v, int):
        return _count(v)  # (math.isfinite(10**400) raises OverflowError)
    return isinstance(v, float) and math.isfinite(v) and v >= 0


def _counts(v, most: int | None = None) -> bool:
    return isinstance(v, list) and all(_count(x) and (most is None or x <= most) for x in v)


def damage(doc: dict) -> str | None:
    """What in an eval document (config, prompts, results) a resumed eval could not use, or None. The
    types and ranges result_record writes: a file edited by hand or cut by a bug is refused, not half used."""
    config, k = doc["config"], doc["config"].get("k")
    if not _count(k) or not 1 <= k <= K_LIMIT:
        return "config.k is not a K"
    drafters = config.get("drafters")
    if not isinstance(drafters, list) or not all(isinstance(d, str) for d in drafters):
        return "config.drafters is not a list of drafter specs"
    policies = config.get("policies")  # absent in files from before --draft-policy took a list
    if policies is not None and not (isinstance(policies, list) and policies and all(isinstance(p, str) for p in policies)):
        return "config.policies is not a list of draft-length policies"
    for i, p in enumerate(doc["prompts"]):
        if not isinstance(p, dict) or not isinstance(p.get("id"), str) or not isinstance(p.get("category"), str):
            return f"prompts[{i}] has no string id and category"
    checks = {"prompt_id": lambda v: isinstance(v, str), "method": lambda v: v in (AUTOREGRESSIVE, "speculative"),
              "drafter": lambda v: v is None or isinstance(v, str), "policy": lambda v: v is None or isinstance(v, str),
              "tokens": _count, "steps": _count,
              "drafted": _count, "accepted": _count, "wall_s": _seconds,
              "prefill_ms": lambda v: v is None or _seconds(v), "same_tokens": lambda v: v in (True, False, None),
              "accepted_lengths": lambda v: _counts(v, k), "drafted_lengths": lambda v: _counts(v, k),
              "generated_ids": _counts,
              "phases_ms": lambda v: isinstance(v, dict) and all(_seconds(x) for x in v.values())}
    needed = ("prompt_id", "method", "drafter", "tokens", "steps", "wall_s", "same_tokens")  # older files lack the rest
    for i, r in enumerate(doc["results"]):
        if not isinstance(r, dict):
            return f"results[{i}] is not an object"
        for name, ok in checks.items():
            if (name in needed or name in r) and not (name in r and ok(r[name])):
                return f"results[{i}].{name} is missing or not what specview writes"
    return None


def complete_results(doc: dict, prompt_ids: set[str]) -> list[dict]:
    """The results of the prompts that ran through every method (a stop only ever keeps whole prompts, but a
    file edited by hand might not)."""
    config = doc["config"]
    methods = [(AUTOREGRESSIVE, "", "")] + [("speculative", d, p) for _, d, p in variants(config)]
    by_prompt: dict[str, list[dict]] = {}
    for r in doc["results"]:
        by_prompt.setdefault(r["prompt_id"], []).append(r)
    keep = []
    for pid, rs in by_prompt.items():
        if pid in prompt_ids and sorted((r["method"], r["drafter"] or "", result_policy(r, config) or "")
                                        for r in rs) == sorted(methods):
            keep.extend(rs)
    return keep


def default_path(folder: str, target: str) -> str:
    from specview.core.files import clean_name

    t = time.time()
    while True:  # unique to the millisecond, like profile stems
        stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(t)) + f"-{int(t * 1000) % 1000:03d}"
        path = os.path.join(folder, f"{stamp}-{clean_name(target)}.eval.json")
        if not os.path.exists(path):
            return path
        t += 0.001


def result_record(prompt: Prompt, drafter: str | None, record, reference: list[int] | None,
                  policy: str | None = None) -> dict:
    """One run (a bench RunRecord) as the document keeps it. `reference`: the autoregressive tokens of
    this prompt when decoding is greedy (a drafter must emit exactly them), else None; `policy`: the
    draft-length policy of a speculative run."""
    s = record.summary
    speculative = drafter is not None
    same, first = None, None
    if speculative and reference is not None:
        from specview.bench.metrics import same_tokens

        check = same_tokens(reference, record.generated_ids)
        same, first = check["same"], check["first_difference"]
    return nonfinite_to_none({
        "prompt_id": prompt.id, "category": prompt.category,
        "method": "speculative" if speculative else AUTOREGRESSIVE, "drafter": drafter,
        "policy": (policy or "fixed") if speculative else None,
        "tokens": record.tokens, "steps": s.steps, "wall_s": record.wall_s, "prefill_ms": s.prefill_ms,
        "accepted_lengths": [st.accepted for st in record.steps] if speculative else [],
        "drafted_lengths": [len(st.drafted) for st in record.steps] if speculative else [],
        "drafted": s.drafted, "accepted": s.accepted, "same_tokens": same, "first_difference": first,
        "stop_reason": s.stop_reason, "phases_ms": dict(s.phases_ms), "generated_ids": record.generated_ids,
    })


def build_doc(config: dict, prompts: list[dict], results: list[dict], meta: dict, interrupted: bool) -> dict:
    doc = {"schema": EVAL_SCHEMA, "config": config, "prompts": prompts, "results": results}
    done = {r["prompt_id"] for r in results}
    doc["summary"] = summarize(doc)
    doc["complete"] = all(p["id"] in done for p in prompts)
    doc["interrupted"] = interrupted
    doc["meta"] = meta
    return nonfinite_to_none(doc)
