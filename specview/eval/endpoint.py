"""`specview eval --endpoint URL`: the prompt set against a serving endpoint (llama-server, vLLM, any
OpenAI-compatible server), one request at a time, and with --baseline-endpoint the same prompts against the same
model served without speculation. Each result keeps the engine's raw counters as it reported them (llama-server's
`timings`, the /metrics deltas around the request) beside the tokens and the wall time, so a request replayed by
hand gives the same counts. The document is specview.eval/1 with `config.engine`; its summary comes from
eval/engine_summary.py. No torch, no model: the endpoint runs the model."""

from __future__ import annotations

import json
import os
import time

from rich.console import Console

from specview.core import host
from specview.core.errors import SpecviewError
from specview.core.events import nonfinite_to_none
from specview.core.files import ensure_writable_dir, write_json_atomic
from specview.core.prompt_sets import BUILTIN, Prompt, digest, load_prompts
from specview.core.settings import K_LIMIT, Settings
from specview.core.stopping import Stop, run_stoppable
from specview.eval.categories import AUTOREGRESSIVE
from specview.eval.document import build_doc, check_resume, default_path
from specview.eval.engine_summary import ENGINE_POLICY
from specview.remote.endpoint import Completion, Endpoint, probe

WARMUP_TOKENS = 8  # each endpoint's first request pays one-time costs: not timed
RESUME_FIELDS = ("endpoint", "baseline_endpoint", "drafters", "max_new_tokens", "temperature", "top_k", "top_p",
                 "seed", "ignore_eos", "chat", "prompt_set_sha256")


def endpoint_eval(args) -> int:
    return run_stoppable(_eval, args)


def _eval(args, stop: Stop) -> int:
    settings = Settings.from_args(args)
    if not args.endpoint:
        raise SpecviewError("--baseline-endpoint is the same model without speculation beside --endpoint URL; "
                            "give --endpoint too")
    if getattr(args, "prompt", None) is not None:
        raise SpecviewError("eval reads its prompts from --prompts (builtin or a file), not --prompt")
    prompts = load_prompts(args.prompts, args.limit, args.categories)
    stdout, stderr = Console(highlight=False), Console(stderr=True, highlight=False)
    if not stdout.is_terminal:
        stdout.width = max(stdout.width, 132)
    engine = probe(args.endpoint, need_speculation=True)
    base = probe(args.baseline_endpoint, False, "--baseline-endpoint") if args.baseline_endpoint else None
    try:
        args.chat, settings.ignore_eos = prompt_form(args, settings, engine)
        t0 = time.perf_counter()
        warmup = []
        for endpoint in filter(None, (base, engine)):  # warm-up, not kept (its counts are: meta.warmup)
            done = endpoint.complete(prompts[0].text, _short(settings), args.chat)
            warmup.append({"endpoint": endpoint.url, "tokens": done.tokens, "engine": done.raw})
        warmup_s = time.perf_counter() - t0
        engine.learn_spec_types()  # llama-server says its speculative types once a request has run
        config = endpoint_config(settings, args, prompts, engine, base)
        previous = _load_resume(args.resume, config) if args.resume else None
        to_stdout = args.json == "-"  # the document on stdout; the file is still written (--resume reads it)
        out = ((None if to_stdout else args.json) or args.resume
               or default_path(args.profile_dir or settings.profile_dir, config["target"]))
        ensure_writable_dir(os.path.dirname(os.path.abspath(out)), "--json")
        meta = {"cpu": host.cpu_summary(), "cpu_flags": host.cpu_flags(), "device": engine.url,
                "threads": None, "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "resumed_results": 0,
                "engine": engine.info, "baseline_engine": base.info if base else None,
                "timing": {"warmup_s": warmup_s, "loop_s": 0.0, "runs_s": 0.0}, "warmup": warmup}
        results = [r for r in previous["results"] if r["prompt_id"] in {p.id for p in prompts}] if previous else []
        if previous:
            results = whole_prompts(results, config)
            meta["resumed_results"] = len(results)
        done = {r["prompt_id"] for r in results}
        todo = [p for p in prompts if p.id not in done]
        records = [{"id": p.id, "category": p.category} for p in prompts]
        interrupted = False
        loop_start = time.perf_counter()
        try:
            for n, prompt in enumerate(todo, 1):
                if stop:
                    interrupted = True
                    break
                if stderr.is_terminal:
                    stderr.print(f"[{n}/{len(todo)}] {prompt.category} {prompt.id}", style="dim", end="\r")
                results += run_prompt(prompt, engine, base, settings, config, meta["timing"])
                meta["timing"]["loop_s"] = time.perf_counter() - loop_start
                _save(out, build_doc(config, records, results, meta, False))
        except KeyboardInterrupt:
            interrupted = True
        doc = build_doc(config, records, results, meta, interrupted)
        _save(out, doc)
    finally:
        engine.close()
        if base:
            base.close()
    if to_stdout:
        print(json.dumps(doc, indent=1))
        stdout = stderr  # the tables and plots go beside it, on stderr
    show(doc, out, args, stdout, stderr)
    return 130 if interrupted or stop else 0


def prompt_form(args, settings: Settings, engine: Endpoint) -> tuple[bool, bool]:
    """(chat, ignore_eos) as eval treats prompts for its own engine, so the defaults give N tokens per prompt: the
    builtin set goes through the chat template where the server has one (an instruct model: the raw first turn is
    often answered with end-of-sequence at once); prompts sent as written go with ignore_eos. --chat / --no-chat
    and --ignore-eos decide where given."""
    chat = args.chat if args.chat is not None else args.prompts == BUILTIN and engine.has_chat_template()
    return bool(chat), bool(settings.ignore_eos or not chat)


def _short(settings: Settings) -> Settings:
    return Settings(**{**settings.to_json(), "max_new_tokens": min(WARMUP_TOKENS, settings.max_new_tokens)})


def engine_label(info: dict) -> str:
    """'llama-server:ngram-simple', 'vllm', ...: the engine and its drafter where it says which."""
    types = info.get("spec_types") or (info.get("speculative_params") or {}).get("speculative.types")
    return info["kind"] + (f":{types}" if isinstance(types, str) and types and types != "none" else "")


def endpoint_config(settings: Settings, args, prompts: list[Prompt], engine: Endpoint, base: Endpoint | None) -> dict:
    """eval's config, strictly richer: `engine` (what the endpoint said about itself), `endpoint`,
    `baseline_endpoint`; target is the endpoint's model, drafters its one label, k its largest draft (llama-server's
    speculative.n_max) or --k when it does not say."""
    n_max = (engine.info.get("speculative_params") or {}).get("speculative.n_max")
    config = {k: v for k, v in settings.to_json().items() if k not in ("prompt", "profile_dir")}
    config.update(target=engine.info.get("model") or engine.url, draft=engine_label(engine.info),
                  k=n_max if isinstance(n_max, int) and 1 <= n_max <= K_LIMIT else settings.k,
                  chat=bool(args.chat), prompts=args.prompts, limit=args.limit, categories=args.categories,
                  prompt_set_sha256=digest(prompts), num_prompts=len(prompts), drafters=[engine_label(engine.info)],
                  policies=[ENGINE_POLICY], device=None, threads=None, endpoint=engine.url,
                  baseline_endpoint=base.url if base else None, engine=engine.info)
    return config


def _load_resume(path: str, config: dict) -> dict:
    from specview.core.file_schemas import EVAL_SCHEMA, load

    _, doc = load(path)
    if doc["schema"] != EVAL_SCHEMA or not doc["config"].get("engine"):
        raise SpecviewError(f"--resume {path} is not an eval of an endpoint (eval --endpoint)")
    check_resume(path, doc["config"], config, RESUME_FIELDS)
    return doc


def whole_prompts(results: list[dict], config: dict) -> list[dict]:
    """The results of prompts that ran on every endpoint (a stop keeps whole prompts; a hand edit might not)."""
    want = {("speculative", d) for d in config["drafters"]} | ({(AUTOREGRESSIVE, None)} if config["baseline_endpoint"]
                                                             else set())
    by_prompt: dict[str, list[dict]] = {}
    for r in results:
        by_prompt.setdefault(r["prompt_id"], []).append(r)
    return [r for rs in by_prompt.values() if {(x["method"], x["drafter"]) for x in rs} == want for r in rs]


def run_prompt(prompt: Prompt, engine: Endpoint, base: Endpoint | None, settings: Settings, config: dict,
               timing: dict) -> list[dict]:
    out, reference = [], None
    if base is not None:
        done = base.complete(prompt.text, settings, config["chat"])
        timing["runs_s"] += done.wall_s
        reference = done.text if settings.greedy else None
        out.append(result_record(prompt, None, done, None))
    done = engine.complete(prompt.text, settings, config["chat"])
    timing["runs_s"] += done.wall_s
    out.append(result_record(prompt, config["drafters"][0], done, reference))
    return out


def result_record(prompt: Prompt, label: str | None, done: Completion, reference: str | None) -> dict:
    """One request as the document keeps it: the engine's raw figures under `engine` (timings, metric deltas),
    what specview read from them beside (drafted, accepted; steps = target forwards = tokens - accepted)."""
    speculative = label is not None
    record = {"prompt_id": prompt.id, "category": prompt.category,
              "method": "speculative" if speculative else AUTOREGRESSIVE, "drafter": label,
              "policy": ENGINE_POLICY if speculative else None, "tokens": done.tokens,
              "steps": done.tokens - (done.accepted or 0) if speculative else done.tokens,
              "wall_s": done.wall_s, "prefill_ms": done.engine_prompt_ms, "engine_gen_ms": done.engine_gen_ms,
              "prompt_tokens": done.prompt_tokens,
              "same_tokens": None if reference is None else done.text == reference,
              "first_difference": None, "text": done.text, "stop": done.stop, "engine": done.raw}
    if speculative:  # a baseline has no drafts: the keys are left out, not zero
        record.update(drafted=done.drafted, accepted=done.accepted, drafts=done.drafts,
                      accepted_per_position=done.accepted_per_position)
    return nonfinite_to_none(record)


def _save(path: str, doc: dict) -> None:
    try:
        write_json_atomic(path, doc, indent=1)
    except OSError as err:
        raise SpecviewError(f"--json: cannot write {path}: {err.strerror}") from err


def show(doc: dict, out: str, args, stdout: Console, stderr: Console) -> None:
    from specview.eval.tables import render

    stdout.print(render(doc))
    files = [out]
    if not args.no_plots and doc["results"]:
        from specview.eval.plots import terminal_plots, write_plot_files

        for plot in terminal_plots(doc, color=stdout.is_terminal):
            stdout.print(plot)
        files += write_plot_files(doc, out)
    stderr.print(f"results written: {files[0]}  (show again with `specview report {files[0]}`)", soft_wrap=True)
    if len(files) > 1:
        stderr.print("plots written: " + ", ".join(files[1:]), soft_wrap=True)
    if doc["interrupted"]:
        stderr.print(f"interrupted: continue with `specview eval --endpoint {args.endpoint} --resume {out}` "
                     "(same options)", soft_wrap=True)
