"""The methods `specview bench` times: our engine (autoregressive, speculative, draft_autoregressive)
and, with `--peer hf`, transformers' own `generate()` (hf_generate) and assisted generation
(hf_assisted); with `--peer llamacpp`, llama.cpp on the target's GGUF (bench/llamacpp.py). Each method
object runs one generation per call and returns a RunRecord.

The peers do the same work as ours: same models, prompt, N and sampling settings, EOS handled the
same way, and hf_assisted drafts exactly K tokens per step (transformers reads those knobs from the
assistant's generation_config, not from generate() arguments).
"""

from __future__ import annotations

import time
import warnings
from contextlib import contextmanager

import torch
from transformers import StoppingCriteria

from specview.bench.record import RunRecord  # noqa: F401 - its clients import it from here too
from specview.bench.schema import DRAFTING_PEERS, peer_names
from specview.core.policies import first_policy, parse_policies
from specview.core.stopping import Stop
from specview.engine.decoder import eos_token_ids


def drafting(name: str) -> bool:
    """Methods whose work depends on K."""
    return name.startswith("speculative") or name in DRAFTING_PEERS


def variant_name(session, drafter, policy: str | None = None) -> str:
    """A speculative method's name: `speculative` for the first drafter under the first policy (the bench
    file's top level describes it), `speculative:<spec>` for another drafter, `[<policy>]` appended for
    another policy of `--draft-policy a,b,c`."""
    name = "speculative" if drafter is session.drafters[0] else f"speculative:{drafter.spec}"
    first = first_policy(session.settings.draft_policy)
    return name if policy is None or policy == first else f"{name}[{policy}]"


class EngineMethod:
    """One of our methods on a Decoder; K is set per call (the sweep shares one decoder). Speculative
    decoding is one method per drafter: `speculative` for the first, `speculative:<spec>` for the others."""

    def __init__(self, session, method: str, generator: torch.Generator, stop: Stop, drafter=None,
                 policy: str | None = None):
        self.name = method if drafter is None else variant_name(session, drafter, policy)
        self.drafter = drafter
        first = first_policy(session.settings.draft_policy)
        self.policy = (policy or first) if drafter is not None else None
        self.sweeps = self.policy in (None, first)  # --sweep-k sweeps the first policy; the others run at the main K
        self.session = session
        self.stop = stop
        # One generator for the whole command (docs/design/engine.md: seeded once).
        self.decoder = session.decoder(method, drafter=drafter, policy=self.policy, generator=generator)

    def run(self, k: int | None = None, prompt_ids: list[int] | None = None,
            max_new_tokens: int | None = None) -> RunRecord:
        """One generation; the session's prompt and N unless given (eval runs every prompt of a set)."""
        s = self.session.settings
        steps = []
        t0 = time.perf_counter()
        run = self.decoder.start(prompt_ids or self.session.prompt_ids, max_new_tokens or s.max_new_tokens, k=k)
        while not run.done and not self.stop:
            steps.append(run.step())
        wall = time.perf_counter() - t0
        return RunRecord(self.name, k if self.drafter is not None else None, wall, list(run.generated),
                         run.summary, steps)


class HFMethod:
    """transformers' generate() on the same models: alone (hf_generate), assisted by the draft model
    (hf_assisted), or with its prompt lookup (hf_prompt_lookup, beside our ngram drafter: same K, same
    longest n-gram)."""

    def __init__(self, session, assisted: bool, stop: Stop, lookup=None):
        self.name = "hf_prompt_lookup" if lookup else "hf_assisted" if assisted else "hf_generate"
        self.session = session
        self.stop = stop
        self.assisted = assisted
        self.lookup = lookup  # the NgramDrafter whose work this peer does
        self.target = session.target.model
        self.draft = session.draft.model if assisted else None
        self.input_ids = torch.tensor([session.prompt_ids], dtype=torch.long, device=session.device)
        self.attention_mask = torch.ones_like(self.input_ids)
        with quiet_transformers():
            self.config = generation_config(session)

    def run(self, k: int | None = None) -> RunRecord:
        kwargs = {}
        if self.assisted:
            set_assistant_knobs(self.draft, k or self.session.settings.k)
            kwargs["assistant_model"] = self.draft
        if self.lookup is not None:
            kwargs.update(prompt_lookup_num_tokens=k or self.session.settings.k,
                          max_matching_ngram_size=self.lookup.max_n)
        with quiet_transformers(), no_eos(self.target, self.draft, self.session.settings.ignore_eos):
            t0 = time.perf_counter()
            out = self.target.generate(self.input_ids, attention_mask=self.attention_mask,
                                       generation_config=self.config, stopping_criteria=[_StopCriterion(self.stop)],
                                       **kwargs)
            wall = time.perf_counter() - t0
        ids = out[0, self.input_ids.shape[1]:].tolist()
        return RunRecord(self.name, k if self.assisted or self.lookup else None, wall, ids)


def generation_config(session):
    """A complete GenerationConfig with our settings: every knob that changes the distribution is set,
    so nothing falls back to the model's generation_config.json or to transformers' defaults
    (top_k=50 among them)."""
    from transformers import GenerationConfig

    s = session.settings
    tok = session.target.tokenizer
    eos = sorted(eos_token_ids(session.target))
    pad = tok.pad_token_id if tok.pad_token_id is not None else (eos[0] if eos else 0)
    greedy = s.greedy
    return GenerationConfig(
        max_new_tokens=s.max_new_tokens, min_new_tokens=0, min_length=0, do_sample=not greedy,
        temperature=1.0 if greedy else s.temperature, top_k=0 if greedy else s.top_k,
        top_p=1.0 if greedy else s.top_p, min_p=None, typical_p=1.0, epsilon_cutoff=0.0, eta_cutoff=0.0,
        repetition_penalty=1.0, encoder_repetition_penalty=1.0, no_repeat_ngram_size=0, num_beams=1,
        num_return_sequences=1, length_penalty=1.0, bad_words_ids=None, suppress_tokens=None,
        begin_suppress_tokens=None, forced_bos_token_id=None, forced_eos_token_id=None, use_cache=True,
        eos_token_id=None if s.ignore_eos else eos, pad_token_id=pad,
    )


def set_assistant_knobs(draft_model, k: int) -> None:
    """Exactly K drafts per step, every step: passed to generate() these are silently ignored, and the
    heuristic schedule writes its state back into the assistant's config, so reset before each run."""
    gc = draft_model.generation_config
    gc.num_assistant_tokens = k
    gc.num_assistant_tokens_schedule = "constant"
    gc.assistant_confidence_threshold = 0.0


@contextmanager
def no_eos(target, draft, active: bool):
    """--ignore-eos for generate(): the models' generation_config would fill an unset eos_token_id back
    in, so unset it there for the call. (min_new_tokens would instead forbid EOS: another distribution.)"""
    if not active:
        yield
        return
    models = [m for m in (target, draft) if m is not None]
    saved = [m.generation_config.eos_token_id for m in models]
    try:
        for m in models:
            m.generation_config.eos_token_id = None
        yield
    finally:
        for m, eos in zip(models, saved):
            m.generation_config.eos_token_id = eos


@contextmanager
def quiet_transformers():
    """generate() warns about flags we set on purpose (top_k with greedy) and about assisted decoding's
    own internal calls; none of it concerns the user of bench."""
    from transformers.utils import logging as hf_logging

    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(previous)


class _StopCriterion(StoppingCriteria):
    """generate() ends at the next token once a stop is requested (transformers' StoppingCriteria protocol)."""

    def __init__(self, stop: Stop):
        super().__init__()
        self.stop = stop

    def __call__(self, input_ids, scores, **kwargs) -> torch.Tensor:
        return torch.full((input_ids.shape[0],), bool(self.stop), dtype=torch.bool, device=input_ids.device)


def make_methods(session, peer: str | None, generator: torch.Generator, stop: Stop | None = None,
                 skipped: dict | None = None, on_progress=lambda msg: None) -> dict:
    """name -> method object, in table order: autoregressive, one speculative method per drafter,
    draft_autoregressive (when the first model drafter exists), then the peers that do the same work as
    one of ours (hf_assisted needs a draft model, hf_prompt_lookup an ngram drafter; llama.cpp's two
    methods always run, its prompt lookup beside ngram when given). `peer` is --peer's list (`hf`, `llamacpp`, `hf,llamacpp`); a peer that cannot run here goes
    into `skipped` (name -> why, one line) and the others go on. `stop` ends a run at its next step
    (bench's signals)."""
    from specview.drafters.ngram import NgramDrafter

    stop = Stop() if stop is None else stop  # (a Stop is falsy until requested)
    skipped = {} if skipped is None else skipped
    methods = {"autoregressive": EngineMethod(session, "autoregressive", generator, stop)}
    for drafter in session.drafters:  # each drafter under each policy of --draft-policy, drafters first
        for policy in parse_policies(session.settings.draft_policy):
            method = EngineMethod(session, "speculative", generator, stop, drafter, policy)
            methods[method.name] = method
    if session.draft is not None:
        methods["draft_autoregressive"] = EngineMethod(session, "draft_autoregressive", generator, stop)
    peers = peer_names(peer)
    ngram = next((d for d in session.drafters if isinstance(d, NgramDrafter)), None)
    if "hf" in peers:
        methods["hf_generate"] = HFMethod(session, assisted=False, stop=stop)
        if session.draft is not None:
            methods["hf_assisted"] = HFMethod(session, assisted=True, stop=stop)
        if ngram is not None:
            methods["hf_prompt_lookup"] = HFMethod(session, assisted=False, stop=stop, lookup=ngram)
    if "llamacpp" in peers:
        methods.update(llamacpp_methods(session, stop, ngram, skipped))
    try:  # the serving engines' servers: a failure or a stop while one starts stops those already started
        server = next((p for p in peers if p.partition(":")[0] == "llama-server"), None)
        if server is not None:
            from specview.bench.llama_server import llama_server_methods

            methods.update(llama_server_methods(session, stop, server, skipped))
        vllm = next((p for p in peers if p.partition(":")[0] == "vllm"), None)
        if vllm is not None:
            from specview.bench.vllm_peer import vllm_methods

            methods.update(vllm_methods(session, stop, vllm, skipped, on_progress))
    except BaseException:
        for method in methods.values():
            if hasattr(method, "close"):
                method.close()
        raise
    return methods


def llamacpp_methods(session, stop: Stop, ngram, skipped: dict) -> dict:
    """llamacpp_generate and llamacpp_prompt_lookup (with the ngram drafter's longest n-gram when there is
    one: the same work); {} (and why in `skipped`) when llama-cpp-python is missing, the target is not a
    GGUF file or llama.cpp cannot load it."""
    from specview.bench import llamacpp

    why = llamacpp.unavailable(session.settings.target)
    if why is not None:
        skipped["llamacpp"] = why
        return {}
    out = {}
    try:
        out["llamacpp_generate"] = llamacpp.LlamaCppMethod(session, stop)
        out["llamacpp_prompt_lookup"] = llamacpp.LlamaCppMethod(session, stop, lookup=True, ngram=ngram)
    except (ValueError, RuntimeError, OSError) as err:  # llama-cpp-python's "Failed to load model from file"
        skipped["llamacpp"] = f"llama.cpp cannot load {llamacpp.gguf_path(session.settings.target)}: {err}"
        return {}
    return out
