"""One serving endpoint: what kind of server it is, and one completion request with the engine's draft counters.

Kinds, told apart by the endpoints each one has (docs/guide/engines.md):
  llama-server  GET /props answers JSON with default_generation_settings; /slots says whether a slot speculates.
                Draft counts per request come in the response's `timings` (draft_n, draft_n_accepted; absent when
                nothing was drafted); started with --metrics, its /metrics adds verification steps and accepted
                drafts per position, read as deltas around each request.
  vllm          GET /metrics holds `vllm:` names; draft counts are the deltas of its spec_decode counters read
                before and after each request (one request at a time: the deltas are that request's).
  openai        anything else with GET /v1/models: it can serve a baseline, but reports no drafts.
Every problem is one line (SpecviewError, exit 2): refused, not an HTTP server, not OpenAI-compatible, or (for an
endpoint measured for its speculation) no speculation reported."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import httpx

from specview.core.errors import SpecviewError
from specview.remote.prometheus import SpecCounters, engine_of, spec_counters

TIMEOUT_S = 10.0  # probing; a completion may take long (read=None)
SETTLE_S = 2.0  # how long the counters may lag the response (llama-server adds a request's counts as its slot ends)
LLAMA_SERVER, VLLM, OPENAI = "llama-server", "vllm", "openai"
LENGTH, EOS, EMPTY = "length", "eos", "empty"  # Completion.stop
NO_SPECULATION = {
    LLAMA_SERVER: "llama-server at {url} does not speculate: start it with --spec-type (ngram-simple, ngram-map-k, "
                  "ngram-mod) or -md DRAFT.gguf",
    VLLM: "vLLM at {url} exports no spec_decode counters on /metrics: start it with --speculative-config",
    OPENAI: "{url} reports no speculation (specview reads drafts from llama-server's timings or vLLM's /metrics)",
}


@dataclass
class Completion:
    """One request's outcome: the engine's raw counters as it reported them (`raw`) and what specview reads from
    them. drafted / accepted are None when the engine reports no drafts (a baseline); drafts (verification steps)
    and accepted_per_position only where the engine exports them."""

    text: str
    tokens: int
    prompt_tokens: int | None
    wall_s: float
    drafted: int | None = None
    accepted: int | None = None
    drafts: int | None = None
    accepted_per_position: list[int] | None = None
    engine_prompt_ms: float | None = None
    engine_gen_ms: float | None = None
    raw: dict = field(default_factory=dict)
    stop: str = LENGTH  # LENGTH: the N tokens asked for; EOS or EMPTY: the request ended early (see ended())

    @property
    def early(self) -> bool:
        return self.stop != LENGTH


def ended(text: str, tokens: int, asked: int) -> str:
    """Why a request ended: LENGTH when it gave the N tokens asked for, EMPTY when its text is empty (an instruct
    model that answers a raw first turn with end-of-sequence), EOS when it stopped before N. tokens/s and tau of
    a request that ended early cover only its few tokens."""
    if not text.strip():
        return EMPTY
    return LENGTH if tokens >= asked else EOS


class Endpoint:
    def __init__(self, url: str, client: httpx.Client, kind: str, info: dict, metrics: bool):
        self.url, self.client, self.kind, self.info, self.metrics = url, client, kind, info, metrics

    @property
    def speculative(self) -> bool:
        return bool(self.info.get("speculative"))

    def close(self) -> None:
        self.client.close()

    def learn_spec_types(self) -> None:
        """llama-server names its speculative types in a slot's params once the slot has served a request (/props
        keeps the per-request default, "none"): info["spec_types"] from there."""
        if self.kind != LLAMA_SERVER:
            return
        response = self._get("/slots")
        slots = _json(response)
        for slot in slots if isinstance(slots, list) else []:
            types = ((slot or {}).get("params") or {}).get("speculative.types") if isinstance(slot, dict) else None
            if isinstance(types, str):
                named = [t for t in types.split(",") if t and t != "none"]
                if named:
                    self.info["spec_types"] = ",".join(named)
                    return

    def has_chat_template(self) -> bool:
        """Whether the server applies a chat template (/v1/chat/completions would work): llama-server says so in
        /props; vLLM's /tokenize applies the template to messages and answers an error without one."""
        if self.kind == LLAMA_SERVER:
            return bool(self.info.get("chat_template"))
        if self.kind != VLLM:
            return False
        body = {"model": self.info.get("model") or "", "messages": [{"role": "user", "content": "hello"}],
                "add_generation_prompt": True}
        try:
            response = self.client.post("/tokenize", json=body)
        except httpx.HTTPError:
            return False
        return response.status_code == 200 and isinstance(_json(response), dict)

    def counters(self) -> SpecCounters | None:
        if not self.metrics:
            return None
        response = self._get("/metrics")
        return spec_counters(response.text) if response.status_code == 200 else None

    def complete(self, prompt: str, settings, chat: bool = False) -> Completion:
        """One request, alone (the counters' deltas are only its own with nothing else in flight)."""
        path, body = self._request(prompt, settings, chat)
        before = self.counters()
        t0 = time.perf_counter()
        try:
            response = self.client.post(path, json=body, timeout=httpx.Timeout(TIMEOUT_S, read=None))
        except httpx.HTTPError as err:
            raise SpecviewError(f"{self.url}{path}: the request failed: {_why(err)}") from None
        wall = time.perf_counter() - t0
        if response.status_code != 200:
            raise SpecviewError(f"{self.url}{path} answered {response.status_code}: {_error_text(response)}")
        try:
            data = response.json()
        except ValueError:
            raise SpecviewError(f"{self.url}{path} did not answer JSON: not an OpenAI-compatible server") from None
        done = self._read(data, wall, chat)
        done.raw["request"] = {"path": path, "body": body}  # replayable by hand: the counts come back the same
        done.stop = ended(done.text, done.tokens, settings.max_new_tokens)
        if before is not None:
            self._add_deltas(done, before)
        return done

    # requests and answers ------------------------------------------------------------------------------

    def _request(self, prompt: str, s, chat: bool) -> tuple[str, dict]:
        sampling = {"temperature": 0.0 if s.greedy else s.temperature, "top_p": s.top_p, "seed": s.seed}
        if self.kind in (LLAMA_SERVER, VLLM):  # both take these beside the OpenAI fields
            sampling.update(ignore_eos=s.ignore_eos)
            if s.top_k:
                sampling["top_k"] = s.top_k
        if self.kind == LLAMA_SERVER:
            # a full prefill every request, like our runs (no reuse of an earlier request's prompt), and none of
            # its other samplers (its defaults: top_k 40, min_p 0.05, ...)
            sampling.update(cache_prompt=False, min_p=0.0, top_k=s.top_k, repeat_penalty=1.0)
        if chat:
            return "/v1/chat/completions", {"model": self.info.get("model") or "", "max_tokens": s.max_new_tokens,
                                            "messages": [{"role": "user", "content": prompt}], **sampling}
        if self.kind == LLAMA_SERVER:
            return "/completion", {"prompt": prompt, "n_predict": s.max_new_tokens, "stream": False, **sampling}
        return "/v1/completions", {"model": self.info.get("model") or "", "prompt": prompt,
                                   "max_tokens": s.max_new_tokens, **sampling}

    def _read(self, data: dict, wall: float, chat: bool) -> Completion:
        if not isinstance(data, dict):
            raise SpecviewError(f"{self.url} answered {type(data).__name__}, not a completion")
        timings = data.get("timings") if isinstance(data.get("timings"), dict) else None
        usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
        if "content" in data:  # llama-server's /completion
            text, finish = data["content"], data.get("stop_type")
        else:
            try:
                choice = data["choices"][0]
                text = choice["message"]["content"] if chat else choice["text"]
            except (KeyError, IndexError, TypeError):
                raise SpecviewError(f"{self.url} answered JSON that is not an OpenAI completion") from None
            finish = choice.get("finish_reason") if isinstance(choice, dict) else None
        tokens = (timings or {}).get("predicted_n", data.get("tokens_predicted", usage.get("completion_tokens")))
        if not isinstance(tokens, int):
            raise SpecviewError(f"{self.url} did not say how many tokens it generated (usage.completion_tokens)")
        prompt_tokens = (timings or {}).get("prompt_n", usage.get("prompt_tokens"))
        done = Completion(text=text or "", tokens=tokens, prompt_tokens=prompt_tokens, wall_s=wall)
        if finish is not None:
            done.raw["finish_reason"] = finish  # as the engine said it (OpenAI's finish_reason, llama-server's stop_type)
        if timings is not None:
            done.raw["timings"] = timings
            done.engine_prompt_ms, done.engine_gen_ms = timings.get("prompt_ms"), timings.get("predicted_ms")
            if self.kind == LLAMA_SERVER and self.speculative:  # draft_n is left out when nothing was drafted
                done.drafted = int(timings.get("draft_n", 0))
                done.accepted = int(timings.get("draft_n_accepted", 0))
        return done

    def _add_deltas(self, done: Completion, before: SpecCounters) -> None:
        """The counters' movement over this request. llama-server adds a request's counts when its slot ends,
        which may be just after the response: read until they cover its draft_n (vLLM: its generated tokens)."""
        deadline = time.perf_counter() + SETTLE_S
        while True:
            after = self.counters()
            if after is None:
                return
            delta = after.minus(before)
            settled = (delta.draft_tokens == done.drafted if done.drafted is not None
                       else delta.generated is None or delta.generated >= done.tokens)
            if settled or time.perf_counter() > deadline:
                break
            time.sleep(0.02)
        done.raw["metrics_delta"] = delta.to_json()
        done.drafts = delta.drafts
        done.accepted_per_position = delta.per_position
        if done.drafted is None and self.speculative:  # vLLM (and a llama-server answer without timings)
            done.drafted, done.accepted = delta.draft_tokens, delta.accepted

    def _get(self, path: str) -> httpx.Response:
        try:
            return self.client.get(path)
        except httpx.HTTPError as err:
            raise SpecviewError(f"{self.url}{path}: {_why(err)}") from None


def probe(url: str, need_speculation: bool, what: str = "--endpoint") -> Endpoint:
    """The endpoint at `url`, its kind found from its endpoints; one line (SpecviewError) when it is refused,
    not an HTTP server, not OpenAI-compatible, or (need_speculation) reports no speculation."""
    url = url.rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise SpecviewError(f"{what} {url}: give an http:// or https:// URL")
    client = httpx.Client(base_url=url, timeout=TIMEOUT_S)
    try:
        endpoint = _identify(url, client, what)
        if need_speculation and not endpoint.speculative:
            raise SpecviewError(f"{what}: " + NO_SPECULATION[endpoint.kind].format(url=url))
    except BaseException:
        client.close()
        raise
    return endpoint


def _identify(url: str, client: httpx.Client, what: str) -> Endpoint:
    def get(path: str) -> httpx.Response:
        try:
            return client.get(path)
        except httpx.ConnectError as err:
            raise SpecviewError(f"{what}: cannot reach {url}: {_why(err)}") from None
        except httpx.HTTPError as err:
            raise SpecviewError(f"{what}: {url} is not an HTTP server ({_why(err)})") from None

    props = _json(get("/props"))
    metrics = get("/metrics")
    exposition = metrics.text if metrics.status_code == 200 else ""
    try:
        exported = engine_of(exposition) if exposition else None
    except SpecviewError:
        exported = None  # a /metrics in another format: not an engine we read counters from
    if isinstance(props, dict) and "default_generation_settings" in props:
        slots = _json(get("/slots"))
        params = (props.get("default_generation_settings") or {}).get("params") or {}
        speculative = (any(isinstance(s, dict) and s.get("speculative") for s in slots) if isinstance(slots, list)
                       else params.get("speculative.types") not in (None, "", "none"))
        info = {"kind": LLAMA_SERVER, "url": url, "version": props.get("build_info"),
                "model": _model_name(props.get("model_path")), "model_path": props.get("model_path"),
                "speculative": speculative, "metrics": exported == "llamacpp",
                "speculative_params": {k: v for k, v in params.items() if k.startswith("speculative.")},
                "n_ctx": (props.get("default_generation_settings") or {}).get("n_ctx"),
                "chat_template": bool(props.get("chat_template"))}
        return Endpoint(url, client, LLAMA_SERVER, info, exported == "llamacpp")
    models = _json(get("/v1/models"))
    model = None
    if isinstance(models, dict) and isinstance(models.get("data"), list) and models["data"]:
        model = (models["data"][0] or {}).get("id") if isinstance(models["data"][0], dict) else None
    if exported == "vllm":
        version = _json(get("/version"))
        counters = spec_counters(exposition)
        info = {"kind": VLLM, "url": url, "version": (version or {}).get("version") if isinstance(version, dict)
                else None, "model": model, "speculative": counters is not None, "metrics": True}
        return Endpoint(url, client, VLLM, info, True)
    if model is None and not (isinstance(models, dict) and isinstance(models.get("data"), list)):
        raise SpecviewError(f"{what}: {url} is not an OpenAI-compatible server (no /v1/models, no llama-server "
                            "/props, no vLLM /metrics)")
    return Endpoint(url, client, OPENAI, {"kind": OPENAI, "url": url, "version": None, "model": model,
                                          "speculative": False, "metrics": False}, False)


def _json(response: httpx.Response):
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def _model_name(path) -> str | None:
    return path.replace("\\", "/").rsplit("/", 1)[-1] if isinstance(path, str) and path else None


def _why(err: Exception) -> str:
    text = str(err) or type(err).__name__
    if isinstance(err, httpx.ConnectError) and "refused" in text.lower():
        return "connection refused"
    return text.splitlines()[0][:160]


def _error_text(response: httpx.Response) -> str:
    try:
        data = response.json()
        err = data.get("error") if isinstance(data, dict) else None
        if isinstance(err, dict):
            return str(err.get("message") or err)[:200]
        return str(err or data)[:200]
    except ValueError:
        return response.text[:200].replace("\n", " ")
