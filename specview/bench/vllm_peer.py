"""vLLM as a bench peer (`--peer vllm[:ngram|eagle3|draft]`): two vLLM servers started by specview on loopback
ports (remote/vllm_server.py) with the target's folder and our thread count, one without speculation
(vllm_generate) and one with METHOD (vllm_speculative; default ngram, with our ngram drafter's longest and shortest
n-gram; eagle3 with the EAGLE-3 head among --draft; draft with the draft model's folder), K drafts per step. Both are
started before the warm-up (minutes of graph compile each, shown as progress, never timed).

Each run is one /v1/completions request with our prompt ids (no second tokenization), exactly N tokens (max_tokens N,
ignore_eos as bench), greedy or our sampling settings with vLLM's other samplers off, timed in the same interleaved
rounds as our methods. vLLM says nothing per request about its drafts: its acceptance and per-position acceptance are
the deltas of its Prometheus counters over the request (vllm:spec_decode_num_drafts, _num_draft_tokens,
_num_accepted_tokens, _num_accepted_tokens_per_pos{position}; one request at a time, so the deltas are that
request's), kept raw in each run's `engine.metrics_delta`. Tokens per step = tokens / (tokens - accepted): every
target forward emits one token of its own.

An optional extra (`make engines`): no vLLM, a target without a folder vLLM can read, or a server that does not start
skips the peer with one line, and bench goes on."""

from __future__ import annotations

import time

import httpx
import torch

from specview.bench.record import RunRecord
from specview.core.errors import SpecviewError
from specview.core.stopping import Stop
from specview.remote import vllm_server
from specview.remote.endpoint import probe

DEFAULT_METHOD = "ngram"
DRAFT_ROOM = 64  # context past prompt + N for the drafts of the last step
SETTLE_S = 5.0  # how long the counters may lag the response
# vLLM's processes keep polling their shared-memory queues (sched_yield in a loop) for a second after each message
# before they sleep: bench waits that long after a run, untimed, so the next method does not share the cores with it
SPIN_S = 1.2


def split_peer(peer: str) -> str:
    """'vllm:eagle3' -> 'eagle3'; 'vllm' -> ngram."""
    _, _, method = peer.partition(":")
    return method or DEFAULT_METHOD


class VllmMethod:
    def __init__(self, session, server: vllm_server.VllmServer, method: str | None, info: dict):
        s = session.settings
        self.name = "vllm_speculative" if method else "vllm_generate"
        self.server, self.method, self.info = server, method, info
        self.sweeps = False  # the number of drafts is fixed when the server starts: the main K only
        self.endpoint = probe(server.url, need_speculation=method is not None, what="--peer vllm")
        greedy = s.greedy
        self.body = {"model": server.model, "prompt": list(session.prompt_ids), "max_tokens": s.max_new_tokens,
                     "ignore_eos": s.ignore_eos, "seed": s.seed, "temperature": 0.0 if greedy else s.temperature,
                     "top_k": -1 if greedy or not s.top_k else s.top_k, "top_p": 1.0 if greedy else s.top_p,
                     "min_p": 0.0, "repetition_penalty": 1.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
                     "return_token_ids": True, "stream": False}
        info["version_served"] = self.endpoint.info.get("version")

    def run(self, k: int | None = None) -> RunRecord:
        before = self.endpoint.counters()
        t0 = time.perf_counter()
        try:
            response = self.endpoint.client.post("/v1/completions", json=self.body,
                                                 timeout=httpx.Timeout(10.0, read=None))
        except httpx.HTTPError as err:
            raise SpecviewError(f"{self.server.label} at {self.server.url}: {err} ({self.server.tail()})") from None
        wall = time.perf_counter() - t0
        if response.status_code != 200:
            raise SpecviewError(f"{self.server.label} answered {response.status_code}: {response.text[:200]}")
        choice = response.json()["choices"][0]
        ids = [int(t) for t in choice.get("token_ids") or []]
        engine = {"finish_reason": choice.get("finish_reason")}
        if self.method is not None and before is not None:
            delta = self._delta(before, len(ids))
            engine["metrics_delta"] = delta.to_json()
            forwards = len(ids) - delta.accepted
            engine.update(drafted=delta.draft_tokens, accepted=delta.accepted, drafts=delta.drafts,
                          accepted_per_position=list(delta.per_position),
                          acceptance_rate=delta.accepted / delta.draft_tokens if delta.draft_tokens else None,
                          mean_emitted_per_step=len(ids) / forwards if forwards > 0 else None)
        time.sleep(SPIN_S)
        return RunRecord(self.name, k if self.method else None, wall, ids, engine=engine)

    def _delta(self, before, tokens: int):
        """The counters' movement over the request, read until they cover its generated tokens."""
        deadline = time.perf_counter() + SETTLE_S
        while True:
            delta = self.endpoint.counters().minus(before)
            if delta.generated is None or delta.generated >= tokens or time.perf_counter() > deadline:
                return delta
            time.sleep(0.02)

    def close(self) -> None:
        self.endpoint.close()
        self.server.close()


def head_folder(session, method: str) -> str | None:
    """The model vLLM drafts with: eagle3, the EAGLE-3 head among --draft (its folder); draft, the draft model's
    folder (a GGUF draft's converted folder). None when --draft has none."""
    for drafter in session.drafters:
        head = getattr(drafter, "base", drafter)  # a tree drafts with the head it wraps (`eagle3;tree:...`)
        if method == "eagle3" and getattr(head, "head_path", None):  # `--draft eagle3[:PATH]` (issue eagle)
            return head.head_path  # the folder it was loaded from: eagle3:PATH's, or the one shipped
    if method == "draft" and session.draft is not None:
        return vllm_server.model_folder(session.draft.spec.partition("@")[0])
    return None


def vllm_methods(session, stop: Stop, peer: str, skipped: dict, on_progress=lambda msg: None) -> dict:
    """vllm_generate and vllm_speculative, each on a server of its own; {} (and why in `skipped`) when vLLM is not
    installed, the target has no folder vLLM reads, or a server does not start. A stop during the start-up (minutes)
    stops the servers and raises KeyboardInterrupt."""
    from specview.drafters.ngram import NgramDrafter

    s = session.settings
    key = "vllm"
    python = vllm_server.find_python()
    if python is None:
        skipped[key] = vllm_server.NOT_INSTALLED
        return {}
    method = split_peer(peer)
    try:
        draft_model = head_folder(session, method) if method != "ngram" else None
        if method != "ngram" and draft_model is None:
            raise SpecviewError(f"--peer vllm:{method} needs "
                                + ("an EAGLE-3 head among --draft (issue eagle)" if method == "eagle3"
                                   else "a draft model among --draft"))
        model = vllm_server.model_folder(s.target.partition("@")[0])
        ngram = next((d for d in session.drafters if isinstance(d, NgramDrafter)), None)
        lookup = (ngram.max_n, ngram.min_n) if ngram is not None else (4, 1)
        spec = vllm_server.speculative_config(method, s.k, lookup, draft_model)
    except SpecviewError as err:
        skipped[key] = str(err)
        return {}
    threads = torch.get_num_threads()  # --threads, or torch's default: the same for every method
    max_len = len(session.prompt_ids) + s.max_new_tokens + DRAFT_ROOM + s.k
    version = vllm_server.version(python)
    out, servers = {}, []
    try:
        for kind, config in ((None, None), (method, spec)):
            label = f"vLLM {kind or 'plain'}"
            with stop.immediately():  # minutes of start-up: a signal stops it at once
                server = vllm_server.VllmServer(python, model, threads, config, max_len, on_progress, label)
            servers.append(server)
            info = {"implementation": "vllm", "version": version, "python": python, "model": model,
                    "n_threads": threads, "max_model_len": max_len, "method": kind, "speculative_config": config,
                    "flags": server.flags, "env": server.env, "url": server.url, "start_s": server.start_s}
            method_obj = VllmMethod(session, server, kind, info)
            out[method_obj.name] = method_obj
    except SpecviewError as err:
        for server in servers:
            server.close()
        skipped[key] = str(err)
        return {}
    except BaseException:
        for server in servers:
            server.close()
        raise
    return out
