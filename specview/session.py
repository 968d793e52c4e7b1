"""What every client (run, bench, the TUI) does before stepping: settings from the command line,
device and threads, models loaded and checked, the prompt tokenized and checked against the context."""

from __future__ import annotations

import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from specview.core import host, load
from specview.core.draft_spec import DraftSpec, parse_drafts
from specview.core.errors import SpecviewError
from specview.core.events import EVENTS_SCHEMA
from specview.core.policies import first_policy
from specview.core.prompt_text import text_problem
from specview.core.settings import Settings, draft_for_device
from specview.drafters.specs import build as build_drafter
from specview.engine.decoder import Decoder
from specview.engine.device import name as device_name
from specview.engine.drafter import context_holders
from specview.engine.phase_timer import PhaseTimer
from specview.models.loader import LoadedModel, check_same_vocab, load_model, resolve_device


@dataclass
class Session:
    settings: Settings
    target: LoadedModel
    drafters: list  # one per --draft spec, in order (drafters/); empty for the target alone
    prompt_ids: list[int]
    device: torch.device
    load_s: float
    notes: list[str] = field(default_factory=list)  # what loading chose and wants said (self:auto's choice)
    forwards: dict = field(default_factory=dict)  # model spec -> fast_path.ForwardChoice.to_json()
    # What the Decoder calls between two steps: the fast path's take_finished_builds where a forward is built in
    # the background (prepare_forwards), else nothing.
    between_steps: Callable | None = None

    @property
    def draft(self) -> LoadedModel | None:
        """The first draft model among the drafters (None: n-gram lookup only, or the target alone)."""
        return next((d.lm for d in self.drafters if getattr(d, "lm", None) is not None), None)

    def decoder(self, method: str = "speculative", timer: PhaseTimer | None = None, drafter=None,
                policy: str | None = None, generator: torch.Generator | None = None) -> Decoder:
        """A Decoder for `method`: speculative with `drafter` (default: the first), autoregressive (the
        target alone) or draft_autoregressive (the first drafter's model alone); `policy` (default: the first
        of --draft-policy, which bench and eval take as a list) chooses how many of K to draft."""
        s = self.settings
        drafter = (drafter or (self.drafters[0] if self.drafters else None)) if method == "speculative" else None
        target = self.draft if method == "draft_autoregressive" else self.target
        return Decoder(target, drafter, s.sampling, k=s.k, seed=s.seed,
                       timer=timer or PhaseTimer(self.device), ignore_eos=s.ignore_eos,
                       policy=policy or first_policy(s.draft_policy),
                       cost_curve=self.cost_curve() if "goodput" in s.draft_policy else None, generator=generator,
                       between_steps=self.between_steps)

    def memory(self) -> dict:
        """Peak RSS since the process started, beside the bytes of each model's weights (the fast path's copies
        included, each storage once): what decides whether a machine can hold the pair (run -v, bench)."""
        from specview.engine.memory import MB, peak_rss_mb, weights_mb

        models = {self.target.spec: self.target}
        for drafter in self.drafters:
            lm = getattr(drafter, "lm", None)
            if lm is not None and lm.model is not self.target.model:
                models.setdefault(lm.spec, lm)
        weights = {spec: round(weights_mb(lm), 1) for spec, lm in models.items()}
        out = {"peak_rss_mb": round(peak_rss_mb(), 1), "weights_mb": weights,
               "weights_total_mb": round(sum(weights.values()), 1)}
        if self.device.type == "mps":  # unified memory: RSS does not count the GPU's buffers, the driver's total does
            out["mps_driver_mb"] = round(torch.mps.driver_allocated_memory() / MB, 1)
        return out

    def cost_curve(self):
        """This machine's cost curve for the target (`specview calibrate`), or None."""
        mode = (self.forwards.get(self.settings.target) or {}).get("mode")
        return host.cached_curve(host.cost_key(self.settings.target, torch.get_num_threads(),
                                               torch.__version__, mode, str(self.device), device_name(self.device)))

    def meta(self) -> dict:
        """Config, seed, versions, device, cpu, threads: what a profile or bench file records."""
        import transformers

        return {
            "config": self.settings.to_json(),
            "seed": self.settings.seed,
            "versions": {"specview": _version(), "torch": torch.__version__, "transformers": transformers.__version__,
                         "python": platform.python_version()},
            "device": str(self.device),
            "device_name": device_name(self.device),  # the GPU's model (torch.cuda.get_device_name), "mps", None
            "cpu": host.cpu_summary(),  # the model name and the ISA flags that decide the kernels
            "threads": torch.get_num_threads(),
            "target_dtype": str(self.target.dtype).removeprefix("torch."),
            "draft_dtype": str(self.draft.dtype).removeprefix("torch.") if self.draft else None,
            "drafter": ",".join(d.spec for d in self.drafters) or None,  # DESIGN "Drafters": the spec
            "forwards": self.forwards,  # per model: compiled or eager, and the kernel of each piece
            "cpu_flags": host.cpu_flags(),
            "host": platform.node(),  # with cpu: whose cost curve (host.profile_cost_key) fits this file
            "prompt_ids": self.prompt_ids,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specview")
    except PackageNotFoundError:
        return "dev"


def encode_prompt(tokenizer, prompt: str, chat: bool) -> list[int]:
    problem = text_problem(prompt)
    if problem:  # the tokenizer would raise a TypeError that names none of this
        raise SpecviewError(f"the prompt is not text: {problem}")
    if chat:
        if not getattr(tokenizer, "chat_template", None):
            raise SpecviewError("--chat: this tokenizer has no chat template; drop --chat")
        ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                            tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return list(ids)
    ids = tokenizer(prompt, add_special_tokens=True)["input_ids"] if prompt else []
    if not ids:
        if tokenizer.bos_token_id is None:
            raise SpecviewError("empty prompt and the tokenizer has no BOS token to start from: give --prompt")
        ids = [tokenizer.bos_token_id]
    return list(ids)


def check_context(models: list, prompt_len: int, max_new_tokens: int) -> None:
    """Prompt + N within the smallest context of the models (LoadedModels, or a drafter with a context of its own:
    llama.cpp's cache; None and context-free drafters are passed over)."""
    limits = [(m.context_len, m.spec) for m in models if getattr(m, "context_len", None)]
    if not limits:
        return
    limit, spec = min(limits)
    if prompt_len + max_new_tokens > limit:
        raise SpecviewError(
            f"prompt ({prompt_len} tokens) + N ({max_new_tokens}) = {prompt_len + max_new_tokens} tokens is past "
            f"the context of {spec} ({limit}); lower -N to at most {max(limit - prompt_len, 0)} or shorten the prompt"
        )


def open_session(settings: Settings, on_progress: Callable[[str], None] | None = None,
                 with_draft: bool = True, background: bool = False) -> Session:
    """Load the target and every drafter of `settings.draft` (a spec or a comma-separated list; DESIGN
    "Drafters"), tokenize the prompt, check vocabularies and context. Bad specs fail before any load.
    `background`: a compiled forward this machine has not settled yet is built while the session runs
    (cpu/builds.py): run, the TUI and serve start at once; bench and calibrate, which measure, wait for it."""
    say = on_progress or (lambda msg: None)
    problem = text_problem(settings.prompt or "")
    if problem:  # before the load, not after it
        raise SpecviewError(f"--prompt is not text: {problem}")
    specs = parse_drafts(settings.draft) if with_draft else []  # a bad spec fails here, before the load
    # torch's own default takes every core: an OpenMP team then waits at each barrier for a thread that shares its
    # core with anything else (a niced loop made the default run several times slower). One core is left free; a
    # count the process was given already (OMP_NUM_THREADS, the test suite's 1) is not raised.
    torch.set_num_threads(settings.threads or min(torch.get_num_threads(), load.default_threads()))
    device = resolve_device(settings.device)
    notes: list[str] = []
    int4_problem, default_problem = (None, None) if settings.device_map else int4_problems(device)
    if with_draft and draft_for_device(settings.draft, default_problem is None) != settings.draft:
        chosen = draft_for_device(settings.draft, False)
        notes.append(f"default draft on {device.type}: {chosen} ({default_problem})")
        say(notes[-1])
        settings.draft = chosen
        specs = parse_drafts(chosen)
    check_int4_specs(settings.target, specs, int4_problem)
    t0 = time.perf_counter()
    loaded: dict = {}  # one load per source: the default pair's int4 draft is a copy of the target
    say(f"loading target {settings.target}")
    target = load_model(settings.target, device, loaded, cache=settings.cache, on_progress=say,
                        device_map=settings.device_map, max_memory=settings.max_memory)
    device = target.device  # with --device-map: the first device (inputs); drafts sit there too
    prompt_ids = encode_prompt(target.tokenizer, settings.prompt, settings.chat)

    drafts: dict[str, LoadedModel] = {}  # spec -> its model: drafters of one spec (a chain and a tree) share it

    def load_draft(spec: str) -> LoadedModel:
        if spec not in drafts:
            say(f"loading draft {spec}")
            drafts[spec] = load_model(spec, device, loaded, cache=settings.cache, on_progress=say)
            check_same_vocab(target, drafts[spec])
        return drafts[spec]

    def note(msg: str) -> None:
        notes.append(msg)
        say(msg)

    drafters = [build_drafter(spec, target, load_draft, prompt_ids, note) for spec in specs]
    check_context(context_holders(target, drafters), len(prompt_ids), settings.max_new_tokens)
    forwards = prepare_forwards([target] + [getattr(d, "lm", None) for d in drafters], settings.compile, say,
                                background)
    building = [spec for spec, choice in forwards.items() if choice.get("building")]
    if building:
        notes.append(f"building the compiled forward of {', '.join(building)} in the background: the run starts on "
                     "transformers' forward and takes the built one between steps (each finished part is kept on disk)")
    session = Session(settings, target, drafters, prompt_ids, device, time.perf_counter() - t0, notes, forwards)
    if building:
        from specview.cpu.fast_path import take_finished_builds

        session.between_steps = take_finished_builds
    return session


def int4_problems(device: torch.device) -> tuple[str | None, str | None]:
    """(why an @int4 spec cannot run on `device`, why the default draft is not @int4 there): None where it is."""
    from specview.models.int4 import default_problem, device_problem

    return device_problem(device), default_problem(device)


def check_int4_specs(target: str, drafts: list[DraftSpec], problem: str | None) -> None:
    """An @int4 model spec on a device without an int4 kernel fails here, in one line, before anything loads."""
    if problem is None:
        return
    if target.partition("@")[2] in ("int4", "int4+head"):
        raise SpecviewError(f"--target {target}: {problem}")
    for draft in drafts:
        if draft.int4:
            raise SpecviewError(f"--draft {draft}: {problem}")


def prepare_forwards(models: list, mode: str, say: Callable[[str], None], background: bool = False) -> dict:

    """fast_path.prepare for every distinct model (a layer-skip view runs transformers' forward of its own):
    spec -> ForwardChoice.to_json(), for the profile's config, --verbose and report."""
    from specview.cpu import fast_path
    from specview.profiling.profile import describe_forward

    chosen: dict = {}
    prepared: dict[int, dict] = {}  # by model object: one left out would run transformers' forward unnoticed
    # A layer-skip view runs transformers' forward over its model's own layers: that model keeps its originals.
    views = any(lm is not None and hasattr(lm.model, "new_cache") for lm in models)
    for lm in models:
        if lm is None or not isinstance(lm.model, torch.nn.Module) or hasattr(lm.model, "new_cache"):
            continue
        if id(lm.model) not in prepared:  # (two specs may name one object: `X` and `X@float32` of a float32 X)
            prepared[id(lm.model)] = fast_path.prepare(lm, mode, say, one_copy=not views,
                                                       background=background).to_json()
            say(describe_forward(lm.spec, prepared[id(lm.model)]))
        else:
            fast_path.attach(lm)  # one model under two specs: both run what was installed on it
        chosen[lm.spec] = prepared[id(lm.model)]
    for lm in models:  # a layer-skip view runs transformers' forward on its own model: packed matmuls there too
        if lm is not None and hasattr(lm.model, "new_cache"):
            fast_path.attach(lm)
    return chosen


def builds_in_flight() -> dict[str, str]:
    """spec -> what each forward still being built in the background is doing (run -v, serve's /health)."""
    from specview.cpu.fast_path import build_status

    return build_status()


def forwards_taken() -> list[tuple[str, dict]]:
    """(spec, choice) of each forward a background build settled since the last call (run -v says why it runs)."""
    from specview.cpu.fast_path import forwards_taken as taken

    return taken()


def unfinished_builds() -> list[str]:
    """One line for each forward still being built in the background as a command ends: what is kept of it, and
    what a later run does."""
    from specview.cpu.fast_path import unfinished_build_notes

    return unfinished_build_notes()


def start_event(session: Session, method: str, num_runs: int, settings: Settings | None = None,
                prompt_ids: list[int] | None = None) -> dict:
    """The `start` record; `settings` / `prompt_ids` when they differ from the session's (a served request)."""
    s = settings or session.settings
    return {
        "type": "start", "schema": EVENTS_SCHEMA, "target": s.target,
        "draft": s.draft if method == "speculative" else None, "method": method, "k": s.k,
        "drafter": session.drafters[0].spec if method == "speculative" and session.drafters else None,
        "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "seed": s.seed, "num_runs": num_runs,
        "device": str(session.device), "threads": torch.get_num_threads(),
        "prompt_ids": session.prompt_ids if prompt_ids is None else prompt_ids,
        "max_new_tokens": s.max_new_tokens, "prompt": s.prompt,
    }


def memory_line(memory: dict) -> str:
    """Session.memory() in one line: the peak, and the weights it has to hold. On MPS the weights sit in GPU
    buffers that RSS does not count: the line says so and gives the driver's total instead of a peak / weights."""
    parts = ", ".join(f"{spec} {mb:,.0f}" for spec, mb in memory["weights_mb"].items())
    line = (f"memory: peak RSS {memory['peak_rss_mb']:,.0f} MiB; weights {memory['weights_total_mb']:,.0f} MiB "
            f"({parts})")
    if memory.get("mps_driver_mb") is not None:
        return line + (f"; RSS does not include GPU buffers (unified memory): the MPS driver holds "
                       f"{memory['mps_driver_mb']:,.0f} MiB")
    ratio = memory["peak_rss_mb"] / memory["weights_total_mb"] if memory["weights_total_mb"] else None
    return line + (f"; peak / weights {ratio:.2f}x" if ratio else "")
