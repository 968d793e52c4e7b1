"""llama.cpp's llama-server as a bench peer (`--peer llama-server[:TYPE]`): the server started by specview on a
loopback port with the target's GGUF and our thread count, once without speculation (llama_server_generate) and
once with its speculative TYPE (llama_server_speculative; default ngram-simple, at most K drafts per step;
draft-simple drafts with the same GGUF, -md). Each run is one /completion request with our prompt ids (no second
tokenization), exactly N tokens, greedy or our sampling settings with its other samplers off, no prompt cache: a
full prefill every run, like ours. Its acceptance is the response's timings (draft_n_accepted / draft_n) and its
tokens per step tokens / (tokens - accepted): every target forward emits one token of its own.

An optional extra (`make engines`): no binary, a target that is not a GGUF file or a server that does not start
skips the peer with one line, and bench goes on."""

from __future__ import annotations

import time

import httpx
import torch

from specview.bench.record import RunRecord
from specview.core.errors import SpecviewError
from specview.core.stopping import Stop
from specview.remote import llama_server

DEFAULT_TYPE = "ngram-simple"
DRAFT_ROOM = 64  # context past prompt + N for the drafts of the last step


def split_peer(peer: str) -> str:
    """'llama-server:ngram-mod' -> 'ngram-mod'; 'llama-server' -> the default type."""
    _, _, spec_type = peer.partition(":")
    return spec_type or DEFAULT_TYPE


class LlamaServerMethod:
    def __init__(self, session, stop: Stop, server: llama_server.LlamaServer, spec_type: str | None, info: dict):
        s = session.settings
        self.name = "llama_server_speculative" if spec_type else "llama_server_generate"
        self.session, self.stop, self.server, self.spec_type = session, stop, server, spec_type
        self.sweeps = False  # the server's largest draft is fixed when it starts: the main K only
        self.client = httpx.Client(base_url=server.url, timeout=httpx.Timeout(10.0, read=None))
        greedy = s.greedy
        self.body = {"prompt": list(session.prompt_ids), "n_predict": s.max_new_tokens, "stream": False,
                     "cache_prompt": False, "return_tokens": True, "ignore_eos": s.ignore_eos, "seed": s.seed,
                     "temperature": 0.0 if greedy else s.temperature, "top_k": 0 if greedy else s.top_k,
                     "top_p": 1.0 if greedy else s.top_p, "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0,
                     "frequency_penalty": 0.0, "presence_penalty": 0.0, "mirostat": 0}
        self.info = info

    def run(self, k: int | None = None) -> RunRecord:
        t0 = time.perf_counter()
        try:
            response = self.client.post("/completion", json=self.body)
        except httpx.HTTPError as err:
            raise SpecviewError(f"llama-server at {self.server.url}: {err} ({self.server.tail()})") from None
        wall = time.perf_counter() - t0
        if response.status_code != 200:
            raise SpecviewError(f"llama-server answered {response.status_code}: {response.text[:200]}")
        data = response.json()
        ids = [int(t) for t in data.get("tokens") or []]
        timings = data.get("timings") or {}
        engine = {"timings": timings}
        if self.spec_type:
            drafted, accepted = int(timings.get("draft_n", 0)), int(timings.get("draft_n_accepted", 0))
            forwards = len(ids) - accepted
            engine.update(drafted=drafted, accepted=accepted,
                          acceptance_rate=accepted / drafted if drafted else None,
                          mean_emitted_per_step=len(ids) / forwards if forwards > 0 else None)
        return RunRecord(self.name, k if self.spec_type else None, wall, ids,
                         first_token_s=None, engine=engine)

    def close(self) -> None:
        self.client.close()
        self.server.close()


def llama_server_methods(session, stop: Stop, peer: str, skipped: dict) -> dict:
    """llama_server_generate and llama_server_speculative, each on a server of its own; {} (and why in `skipped`)
    when the binary is missing, the target is not a GGUF file or a server does not start."""
    from specview.bench.llamacpp import gguf_path

    s = session.settings
    key = "llama-server"
    binary = llama_server.find_binary()
    gguf = gguf_path(s.target)
    if binary is None:
        skipped[key] = llama_server.NOT_BUILT
        return {}
    if gguf is None:
        skipped[key] = f"the target {s.target} is not a .gguf file (llama-server reads GGUF files only)"
        return {}
    spec_type = split_peer(peer)
    threads = torch.get_num_threads()  # --threads, or torch's default: the same for every method
    n_ctx = len(session.prompt_ids) + s.max_new_tokens + DRAFT_ROOM + s.k
    version = llama_server.version(binary)
    out, servers = {}, []
    try:
        for kind in (None, spec_type):
            flags = llama_server.spec_args(kind, s.k, gguf)
            server = llama_server.LlamaServer(binary, gguf, threads, flags, n_ctx=max(n_ctx, 512))
            servers.append(server)
            info = {"implementation": "llama-server", "version": version, "binary": binary, "gguf": gguf,
                    "n_threads": threads, "n_ctx": max(n_ctx, 512), "spec_type": kind,
                    "flags": server.argv[1:], "url": server.url}
            method = LlamaServerMethod(session, stop, server, kind, info)
            out[method.name] = method
    except SpecviewError as err:
        for server in servers:
            server.close()
        skipped[key] = str(err)
        return {}
    return out
