"""The machinery of `specview bench` (its command is cli/bench.py): is speculative decoding worth it for this pair,
and how far from its best is it?

Methods on the same prompt, N and settings, each warmed up once, then timed in interleaved rounds
(A B C A B C ...) so machine drift hits all alike: autoregressive (target alone), speculative,
draft_autoregressive (draft alone) and, with `--peer hf`, transformers' generate() (hf_generate) and
assisted generation (hf_assisted); with `--peer llamacpp`, llama.cpp on the target's GGUF file
(llamacpp_generate, llamacpp_prompt_lookup). Then the metrics of docs/design/metrics.md, a rich table, `--json` and a
bench file in --profile-dir that `specview report` renders.
"""

from __future__ import annotations

import json
import os
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
)

from specview.bench.methods import drafting, variant_name
from specview.bench.metrics import (
    method_stats,
    predict,
    public,
    recommend,
    same_tokens,
    speculative_metrics,
    sweep_inputs,
)
from specview.bench.schema import BENCH_SCHEMA, METHOD_ORDER, PEER_METHODS, peer_names
from specview.bench.tables import ordered
from specview.core.errors import SpecviewError
from specview.core.files import write_json_atomic
from specview.core.policies import parse_policies
from specview.core.stopping import Stop, Stopped

PEER_SAY_S = 30.0


def planned_ks(name: str, method, ks: list[int], main_k: int) -> list:
    """The K values a method is timed at: None for a method without drafts, every K of the sweep for one
    that does the work of one of our drafters, the main K for a peer that runs on its own (llama.cpp's
    prompt lookup without an ngram drafter)."""
    if not drafting(name):
        return [None]
    return ks if getattr(method, "sweeps", True) else [main_k]


def run_rounds(methods: dict, plan: list, num_runs: int, records: dict, on_run=lambda label: None,
               stop: Stop | None = None) -> bool:
    """Warm each (method, K) up once, then time `num_runs` rounds of the whole plan in order
    (A B C A B C ...) so that drift of the machine hits every method alike. Fills `records`;
    returns True if a stop (Ctrl-C, SIGTERM) cut the rounds short: the round in progress is dropped."""
    stop = Stop() if stop is None else stop  # (a Stop is falsy until requested)
    try:
        for name, k in plan:
            on_run(f"warm-up {_label(name, k)}")
            methods[name].run(k)
            on_run(None)
            stop.check()
        for r in range(num_runs):
            for name, k in plan:
                on_run(f"round {r + 1}/{num_runs} {_label(name, k)}")
                record = methods[name].run(k)
                stop.check()  # a run cut short by a stop is not a measurement
                records.setdefault((name, k), []).append(record)
                on_run(None)
    except Stopped:
        return True
    return False


def _label(name: str, k: int | None) -> str:
    return f"{name} K={k}" if k is not None else name


def peer_progress(progress: Progress, console: Console):
    """A serving engine's start-up (vLLM: minutes of graph compile before it answers): its time so far and last log
    line on the progress bar, or a line every PEER_SAY_S on a console that is not a terminal."""
    state = {"task": None, "said": 0.0}

    def on_progress(msg: str) -> None:
        if state["task"] is None:
            state["task"] = progress.add_task(msg, total=None)
        progress.update(state["task"], description=msg[:120])
        if not console.is_terminal and time.monotonic() - state["said"] >= PEER_SAY_S:
            state["said"] = time.monotonic()
            console.print(msg, soft_wrap=True, markup=False, highlight=False)

    return on_progress


def bench_progress(console: Console) -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=console, transient=console.is_terminal)


def build_doc(session, args, ks: list[int], records: dict, load_start, peer_info: dict | None = None,
              skipped: dict | None = None) -> dict:
    """The bench document (specview.bench/1). `peer_info`: method -> how a peer was set up (llama.cpp's
    file, threads, context), added to that method's entry; `skipped`: peer -> why it did not run."""
    s = session.settings
    ar = records[("autoregressive", None)]
    ar_mean = method_stats(ar)["mean_s"]
    greedy = s.greedy
    reference = ar[0].generated_ids

    def check(name: str, k: int | None):
        """Greedy: every run of a target-distribution method must emit our autoregressive tokens."""
        if not greedy:
            return None
        results = [same_tokens(reference, r.generated_ids) for r in records[(name, k)]]
        bad = [x for x in results if not x["same"]]
        return bad[0] if bad else results[0]

    variants = methods_variants(session)  # speculative method -> (drafter, policy)
    drafters = methods_drafters(session)  # the first policy's methods: one per drafter
    labels = {m: d.spec for m, d in drafters.items()}  # speculative method -> drafter spec
    peers_of = {label: peer_of(session, d) for label, d in drafters.items()}  # the peers doing the same work
    per_variant = {}
    for label in variants:
        entries = []
        for k in ks if label in drafters else [s.k]:  # other policies run at the main K (their maximum)
            spec = records[(label, k)]
            entry = speculative_metrics(k, spec, ar)
            entry["methods"] = {label: method_stats(spec, ar_mean)}
            entry["same_tokens"] = {label: check(label, k)}
            for peer in peers_of.get(label, ()):
                if (peer, k) in records:
                    entry["methods"][peer] = method_stats(records[(peer, k)], ar_mean)
                    entry["same_tokens"][peer] = check(peer, k)
            entry.update(sweep_inputs(spec))
            entries.append(entry)
        if args.sweep_k and label in drafters:
            predict(entries)
        per_variant[label] = entries
    per_drafter = {label: per_variant[label] for label in drafters}
    first = per_drafter["speculative"]
    main = next(e for e in first if e["k"] == s.k)
    methods, same = {}, {}
    for entries in per_variant.values():
        at_k = next(e for e in entries if e["k"] == s.k)
        methods.update(at_k["methods"])
        same.update(at_k["same_tokens"])
    for name in METHOD_ORDER:  # the methods no drafter's entries hold
        key = (name, s.k if drafting(name) else None)
        if name not in methods and key in records:
            methods[name] = method_stats(records[key], ar_mean)
            if name in PEER_METHODS:  # the target's law (draft_autoregressive is the draft's, not checked)
                same[name] = check(*key)
    methods = {name: methods[name] for name in ordered(methods)}
    for label, (drafter, policy) in variants.items():
        methods[label]["drafter"] = drafter.spec
        methods[label]["policy"] = policy
    for name, info in (peer_info or {}).items():
        if name in methods:
            methods[name]["peer"] = info
    for m in methods.values():  # a serving engine's own draft counts (llama-server's timings, vLLM's counters), pooled
        pool_engine_counts(m)
    config = {**s.to_json(), "num_runs": args.num_runs, "peer": args.peer,
              "sweep_k": ",".join(map(str, args.sweep_k)) if args.sweep_k else None,
              "prompt_tokens": len(session.prompt_ids)}
    doc = {"schema": BENCH_SCHEMA, "config": config, "methods": methods}
    doc.update({key: value for key, value in public(main).items() if key not in ("methods", "same_tokens")})
    doc["same_tokens"] = same if greedy else None
    # Every drafter's metrics at the main K (the top level repeats the first drafter's, as before).
    doc["drafters"] = {
        labels[label]: {key: value for key, value in public(next(e for e in entries if e["k"] == s.k)).items()
                        if key not in ("methods", "same_tokens")} | {"method": label}
        for label, entries in per_drafter.items()
    }
    # Every policy of --draft-policy at the main K (its maximum), per drafter: the same metrics, side by side.
    doc["policies"] = {}
    for label, (drafter, policy) in variants.items():
        at_k = next(e for e in per_variant[label] if e["k"] == s.k)
        doc["policies"].setdefault(policy, {})[drafter.spec] = (
            {key: value for key, value in public(at_k).items() if key not in ("methods", "same_tokens")}
            | {"method": label})
    doc["peer_ratios"] = peer_ratios(methods, labels, peers_of, peer_names(args.peer))
    doc["peers_skipped"] = dict(skipped or {})
    if args.sweep_k:
        doc["sweep"] = [public(e) for e in first if e["k"] in args.sweep_k]
        doc["recommended_k"] = recommend([e for e in first if e["k"] in args.sweep_k])
        for label, entries in per_drafter.items():
            swept = [e for e in entries if e["k"] in args.sweep_k]
            doc["drafters"][labels[label]]["sweep"] = [public(e) for e in swept]
            doc["drafters"][labels[label]]["recommended_k"] = recommend(swept)
    doc["roofline"] = bench_roofline(session, records, s.k)
    doc["meta"] = {**session.meta(), "load_avg": {"start": list(load_start), "end": list(os.getloadavg())},
                   "load_s": session.load_s}
    doc["memory"] = session.memory()  # the peak since start (loading included) beside the weights it holds
    return json.loads(json.dumps(doc, allow_nan=False))  # fail here, not halfway through a write


def pool_engine_counts(m: dict) -> None:
    """A serving engine's draft counts over the timed runs: acceptance, tokens per step and (vLLM's counters) the
    acceptance at each position = accepted there / verification steps."""
    runs = [r.get("engine") for r in m.get("runs") or []]
    if not runs or not all(isinstance(e, dict) and "drafted" in e for e in runs):
        return
    drafted, accepted = sum(e["drafted"] for e in runs), sum(e["accepted"] for e in runs)
    tokens = sum(r["tokens"] for r in m["runs"])
    m.update(drafted=drafted, accepted=accepted, acceptance_rate=accepted / drafted if drafted else None,
             mean_emitted_per_step=tokens / (tokens - accepted) if tokens > accepted else None)
    if all("accepted_per_position" in e and "drafts" in e for e in runs):
        drafts = sum(e["drafts"] for e in runs)
        width = max(len(e["accepted_per_position"]) for e in runs)
        per_pos = [sum((e["accepted_per_position"] + [0] * width)[i] for e in runs) for i in range(width)]
        m.update(drafts=drafts, accepted_per_position=per_pos,
                 per_position_acceptance=[a / drafts if drafts else None for a in per_pos])


def peer_ratios(methods: dict, labels: dict, peers_of: dict, peers: list[str]) -> dict | None:
    """tokens/s of ours over a peer's: autoregressive over each peer's plain decoding (hf_generate,
    llamacpp_generate), our first speculative method over llama.cpp's plain and speculative decoding (does
    ours beat a C++ engine, with or without its prompt lookup?), and each drafter over the peer doing the
    same work. None when no peer ran (none asked for, or skipped)."""
    tps = {name: m.get("tokens_per_s") for name, m in methods.items()}
    ratios = {}
    if "hf" in peers:
        ratios["autoregressive_over_hf_generate"] = _over(tps.get("autoregressive"), tps.get("hf_generate"))
    if "llamacpp_generate" in tps:
        ratios["autoregressive_over_llamacpp_generate"] = _over(tps["autoregressive"], tps["llamacpp_generate"])
        ratios["speculative_over_llamacpp_generate"] = _over(tps.get("speculative"), tps["llamacpp_generate"])
    if "llamacpp_prompt_lookup" in tps:  # our first drafter against llama.cpp's own speculative decoding
        ratios["speculative_over_llamacpp_prompt_lookup"] = _over(tps.get("speculative"),
                                                                  tps["llamacpp_prompt_lookup"])
    if "llama_server_generate" in tps:
        ratios["autoregressive_over_llama_server_generate"] = _over(tps["autoregressive"], tps["llama_server_generate"])
    if "llama_server_speculative" in tps:  # our first drafter against llama-server's speculation
        ratios["speculative_over_llama_server_speculative"] = _over(tps.get("speculative"),
                                                                    tps["llama_server_speculative"])
    if "vllm_generate" in tps:
        ratios["autoregressive_over_vllm_generate"] = _over(tps["autoregressive"], tps["vllm_generate"])
    if "vllm_speculative" in tps:  # our first drafter against vLLM's speculation
        ratios["speculative_over_vllm_speculative"] = _over(tps.get("speculative"), tps["vllm_speculative"])
    for label, doing in peers_of.items():
        for peer in doing:
            if peer in tps:
                name = "speculative" if label == "speculative" else labels[label]
                ratios[f"{name}_over_{peer}"] = _over(tps[label], tps[peer])
    return ratios or None


def bench_roofline(session, records: dict, k: int) -> dict | None:
    """summary.roofline of the timed speculative runs at the main K (the first drafter), plus the target's
    one-token forward from the autoregressive runs (`target_one_token`)."""
    from specview.profiling.roofline import roofline_summary, session_roofline

    info = session_roofline(session)
    first = {**info, "drafters": dict(list(info["drafters"].items())[:1])}
    out = roofline_summary([st.to_json() for r in records[("speculative", k)] for st in r.steps], first)
    ar = roofline_summary([st.to_json() for r in records[("autoregressive", None)] for st in r.steps],
                          {**info, "drafters": {}})
    if out is not None and ar is not None:
        out["target_one_token"] = ar["target"]
    return out


def peer_of(session, drafter) -> tuple[str, ...]:
    """The peers that do a drafter's work: HF's and llama.cpp's prompt lookup for ngram, assisted generation
    for the draft model it uses (session.draft)."""
    if drafter.spec.startswith("ngram"):
        return ("hf_prompt_lookup", "llamacpp_prompt_lookup")
    lm = getattr(drafter, "lm", None)
    return ("hf_assisted",) if lm is not None and lm is session.draft else ()


def methods_drafters(session) -> dict:
    """Speculative method name -> its drafter, under the first policy: `speculative` is the first drafter (the
    bench file's top level describes it), `speculative:<spec>` each other one."""
    return {variant_name(session, d): d for d in session.drafters}


def methods_variants(session) -> dict:
    """Speculative method name -> (drafter, policy) for every drafter under every policy of --draft-policy
    (bench/methods.variant_name: `speculative:<spec>[<policy>]`)."""
    return {variant_name(session, d, p): (d, p) for d in session.drafters
            for p in parse_policies(session.settings.draft_policy)}


def _over(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def write_profile_files(session, folder: str, timed_speculative: list, doc: dict) -> tuple[str, str]:
    """The profile of the timed speculative runs at the main K (docs/design/profiles.md: bench writes `<stem>.json` and
    `<stem>.trace.json` like `run --profile`), and beside it `<stem>.bench.json` with the comparison."""
    from specview.profiling.recorder import ProfileRecorder

    recorder = ProfileRecorder(session, "speculative", folder)
    recorder.meta["t_ar_ms"] = doc.get("target_ms_per_token")  # t_ar from the autoregressive runs, as bench's c and v
    for record in timed_speculative:
        for step in record.steps:
            recorder.add_step(step)
    profile = recorder.save([record.summary for record in timed_speculative])
    path = recorder.stem + ".bench.json"
    write_doc(path, doc, "--profile-dir")
    return profile, path


def write_doc(path: str, doc: dict, option: str) -> None:
    try:
        write_json_atomic(path, doc, indent=1)
    except OSError as err:
        raise SpecviewError(f"{option}: cannot write {path}: {err.strerror}") from err
