"""The chooser: which kernel runs each piece of a forward on this machine, and whether the forward runs compiled.

`--compile auto|on|off` (Settings.compile):

    off   transformers' own forward (packed_linear's packed matmuls inside it); every norm hook fires
    on    the engine's own forward compiled with inductor, one row and several (an error where it cannot run): built
          ahead of time into packages a later start loads in milliseconds (aot_compile.AotFunction), or by
          torch.compile with SPECVIEW_AOT=0
    auto  `on` where the model can run it and a probe on this machine finds it faster, else `off`

Per piece (each distinct weight matrix of the fast forward: the fused q/k/v, o, the fused gate/up, down,
the head; the embedding is a lookup), the one-row product runs as a compiled multiply-and-sum
('reduce'), a compiled F.linear ('mm') or the packed copy with its kernel (MLAS, the thin kernels or oneDNN: 'mlas' / 'thin' /
'packed' in the pieces), whichever gives the fastest whole one-token forward (one_row_kernel); several rows run
oneDNN on a packed copy ('packed'), MLAS on its own ('mlas') or the thin kernels on the weight itself ('thin'), where packed_linear's probe finds them faster, else F.linear ('mm'). An int4 piece runs
torch's int4 kernel ('int4') or the thin kernels' on its own copy of the codes ('thin'), whichever that probe finds faster,
for every row count. Only
kernels that compute the same product up to float summation order are chosen automatically: an
`@int4` model keeps its codes, a float32 one its float32 weights.

Every probe's result is kept per machine (host, CPU and its ISA flags), torch version and thread count
in the cache folder (host.py), so every process on the machine runs the same kernels and a second
start probes nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import statistics
import time
from dataclasses import dataclass, field

import torch

from specview.core import host, load
from specview.core.errors import SpecviewError
from specview.cpu import builds
from specview.cpu.forward import aot_compile, gpt2, llama, llama_layers
from specview.cpu.forward.one_copy import restore as restore_originals
from specview.cpu.forward.one_copy import storage_bytes_once
from specview.cpu.matmul import onnx_mlas, packed_linear, thin_kernels

MODES = ("auto", "on", "off")
CHOICE_FILE = "kernels.json"
GAIN = 0.95  # the compiled forward must be at least 5% faster to be chosen: on a tie keep the stock code


@dataclass
class ForwardChoice:
    """What a model's forward runs, for --verbose, the profile's config and report."""

    mode: str  # "compiled" | "eager" (transformers' forward)
    why: str  # one phrase: the probe's figures, or why the compiled path does not apply
    pieces: dict = field(default_factory=dict)  # piece -> {"shape", "dtype", "one_row", "rows"}
    compile_s: float | None = None  # time to compile (cold) or load from inductor's cache (warm)
    released_mb: float | None = None  # the originals one copy released (their packed copies serve every product)
    building: bool = False  # eager for now: the compiled forward is being built in the background (builds.py)
    provisional: bool = False  # its verdict was taken under load: taken again at the next quiet start (core/load.py)

    def to_json(self) -> dict:
        out = {"mode": self.mode, "why": self.why, "pieces": self.pieces, "compile_s": self.compile_s,
               "released_mb": self.released_mb}
        if self.building:
            out["building"] = True
        if self.provisional:
            out["provisional"] = True
        return out


def _key(model, what: str) -> str:
    cfg = model.config
    shape = f"{cfg.model_type} h{cfg.hidden_size} L{cfg.num_hidden_layers} v{cfg.vocab_size}"
    dtype = str(model.get_input_embeddings().weight.dtype).removeprefix("torch.")
    int4 = any(type(m).__name__ == "Int4Linear" for m in model.modules())
    backend = "aot" if aot_compile.aot_enabled() else "dynamo"
    return (f"{host.host_key()}/torch {torch.__version__}/threads={torch.get_num_threads()}/{what}/{backend}/"
            f"{shape}/{dtype}{'+int4' if int4 else ''}")


def prepare(lm, mode: str, say=lambda msg: None, one_copy: bool = True, background: bool = False) -> ForwardChoice:
    """Decide and install the forward of one LoadedModel (llama.install, or nothing for eager). With `one_copy`, a
    compiled forward then holds one copy of each weight (cpu/forward/one_copy.py): the originals its packed copies
    replace are released, and come back when the forward is uninstalled. False where something still runs
    transformers' forward on this model (a layer-skip view over it).

    `background` (`--compile auto` in run, the TUI and serve): on a machine that has not settled this model's forward
    yet, it is built and probed on a thread of its own while the session runs transformers' forward; the engine takes
    it between two steps (take_ready). bench and calibrate measure, so they wait. A model whose second copy would
    take more than BACKGROUND_SHARE of the memory available is built before the first step instead (_too_big_to_double),
    holding one copy throughout."""
    if background and mode == "auto" and _first_time(lm) and not _too_big_to_double(lm, say):
        llama.uninstall(lm.model)
        # Laid out here, on the caller's thread, while no forward runs (it swaps parameters for views of fused
        # matrices); the build's thread chooses and packs each product's kernel, builds the functions and times them.
        _family(lm.model)[0].lay_out(lm.model)
        builds.start(lm.model, lm.spec, lambda progress: _decide(lm, "auto", progress, background=True), one_copy)
        say(f"{lm.spec}: building the compiled forward in the background; the run starts on transformers' forward")
        return ForwardChoice("eager", "the compiled forward is being built in the background: taken between steps "
                                      "when ready", building=True)
    choice, runner = _decide(lm, mode, say, release_as_made=one_copy)
    if runner is not None:
        llama.register(lm.model, runner)
        if one_copy:
            choice.released_mb = round(runner.release_originals() / 2**20, 1)
    return choice


BACKGROUND_SHARE = 0.25  # of the memory available: the most a background build's second copy of the weights may take


def _too_big_to_double(lm, say) -> bool:
    """Whether a background build, which holds the weights twice until the switch (the session reads the originals
    while the copies are made), would take more than BACKGROUND_SHARE of the memory available: then the weights are
    the process's largest cost, and a build before the first step, releasing each layer as its copies are made,
    never holds them twice. A first start then waits for the build (with progress); every later start loads it."""
    available = host.available_memory_bytes()
    seen: set[int] = set()
    need = sum(storage_bytes_once(t, seen) for t in [*lm.model.parameters(), *lm.model.buffers()]
               if t.device.type == "cpu")
    if available is None or need <= BACKGROUND_SHARE * available:
        return False
    say(f"{lm.spec}: building the compiled forward before the first step: a build beside the session would hold "
        f"the weights twice ({need / 2**30:.1f} GiB more, of {available / 2**30:.1f} GiB available)")
    return True


def _first_time(lm) -> bool:
    """Whether this model's forward is still to be settled here: it could run compiled, and no verdict is kept, or
    the one kept was taken under load and the machine is quiet now (core/load.py)."""
    if os.environ.get("SPECVIEW_COMPILE") == "0" or _family(lm.model)[1] or aot_compile.unavailable_reason():
        return False
    kept = host.read_cached(CHOICE_FILE).get(_key(lm.model, "forward"))
    return not isinstance(kept, dict) or load.retake(kept, torch.get_num_threads())


def take_ready(model) -> ForwardChoice | None:
    """A background build of `model`'s forward that has finished, installed now (the caller is between two steps):
    its choice, or None while it is still building (or none was started)."""
    build = builds.finished(model)
    if build is None:
        return None
    if build.choice is None:
        build.choice = ForwardChoice("eager", f"the background build failed: {build.error}")
    if build.runner is not None:
        llama.register(model, build.runner)
        if build.one_copy:
            build.choice.released_mb = round(build.runner.release_originals() / 2**20, 1)
    taken[build.spec] = build.choice.to_json()
    return build.choice


taken: dict[str, dict] = {}  # spec -> the choice of a background build taken between steps (run -v says it)


def _decide(lm, mode: str, say, background: bool = False, release_as_made: bool = False
            ) -> tuple[ForwardChoice, object]:
    """(the choice, the compiled runner to install or None). The runner is not installed here: a background build
    hands it over between steps. `release_as_made`: the runner releases each layer's originals as it makes its
    copies, so the model is never held twice (never in a background build: its session runs transformers' forward
    on the originals meanwhile)."""
    if mode not in MODES:
        raise SpecviewError(f"--compile {mode}: use auto, on or off")
    model = lm.model
    llama.uninstall(model)
    if mode == "off":
        return ForwardChoice("eager", "--compile off"), None
    if mode == "auto" and os.environ.get("SPECVIEW_COMPILE") == "0":  # the test suite's default: see conftest
        return ForwardChoice("eager", "SPECVIEW_COMPILE=0"), None
    family, reason = _family(model)
    reason = reason or aot_compile.unavailable_reason()
    if reason:
        if mode == "on":
            raise SpecviewError(f"--compile on: {lm.spec} cannot run compiled here: {reason} (use --compile auto or off)")
        return ForwardChoice("eager", f"not compiled: {reason}"), None
    cached = host.read_cached(CHOICE_FILE)
    key = _key(model, "forward")
    decided = cached.get(key) if isinstance(cached.get(key), dict) else None
    if decided and load.retake(decided, torch.get_num_threads()):
        say(f"{lm.spec}: taking the kept forward verdict again ({load.describe(decided.get('load'))} when it was "
            "taken)")
        decided = None
    # An eager verdict stands once it was taken against the forward's chosen one-row product and head ("one_row",
    # "head": written since those choices; an older verdict may have lost with a slower forward, and is taken again).
    if mode == "auto" and decided and decided.get("mode") == "eager" and decided.get("one_row") and "head" in decided:
        return (ForwardChoice("eager", kept_why(decided, "a probe found it no faster compiled"),
                              provisional=load.provisional(decided)), None)
    if aot_compile.aot_enabled():
        say(f"loading {lm.spec}'s one-row forward (the first time on a machine, it is built: about 10 s a function)")
    else:
        say(f"compiling {lm.spec}'s one-row forward (inductor; cached on disk after the first time)")
    # A model that is not to be held twice has transformers' forward timed now, on its originals alone, and its
    # compiled forward once the runner holds the copies: apart, not interleaved (which would hold both).
    eager_ms = None
    if release_as_made and mode == "auto" and not (decided and decided.get("mode") == "compiled"):
        say(f"timing {lm.spec}'s one-token forward on transformers' forward (once on a machine)")
        eager_ms = _time_eager(lm)
        packed_linear.drop_packs(model)
    t0 = time.perf_counter()
    say(f"choosing the kernel of each of {lm.spec}'s products (timed once on a machine)")
    runner = family(model, True, "mm", release_as_made=release_as_made)
    try:
        runner.set_one_row(one_row_kernel(model, runner, say))
        _warm(runner)
    except Exception as err:  # noqa: BLE001 - a build that fails (the compiler, export) must not stop the run
        restore_originals(model)  # transformers' forward runs: the originals the runner released come back
        why = f"the compiled forward could not be built: {type(err).__name__}: {str(err).splitlines()[0][:160]}"
        if mode == "on":
            raise SpecviewError(f"--compile on: {lm.spec}: {why} (use --compile auto or off)") from err
        return ForwardChoice("eager", why), None
    compile_s = time.perf_counter() - t0
    pieces = runner.pieces()
    how = _how_built(runner)
    if mode == "on":
        return ForwardChoice("compiled", f"--compile on; {how}", pieces, compile_s), runner
    # A decision timed with another one-row product (older specview chose it on one matrix alone) or another kind of
    # head (the float32 weight before its int8 codes were read) is timed again: its figures are what --verbose and
    # the profile show.
    head = runner.lm_head[0]
    if (decided and decided.get("mode") == "compiled" and decided.get("one_row") == runner.gemv
            and decided.get("head", "dense") == head):
        return (ForwardChoice("compiled", f"{kept_why(decided, '')}; {how}", pieces, compile_s,
                              provisional=load.provisional(decided)), runner)
    with load.watch(torch.get_num_threads()) as watched:
        probe = _probe_forward(lm, runner, eager_ms)
    compiled_ms, eager_ms = probe.ms["compiled"], probe.ms["eager"]
    choice = "compiled" if compiled_ms < GAIN * eager_ms else "eager"
    verdict = {"mode": choice, "compiled_ms": compiled_ms, "eager_ms": eager_ms, "one_row": runner.gemv,
               "head": head, "rounds": probe.rounds, "separated": probe.separated, "load": watched.load,
               "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    verdict["why"] = why = (f"one-token forward {compiled_ms:.1f} ms compiled against {eager_ms:.1f} ms eager "
                            f"({probe.said()}; {load.describe(watched.load)})")
    cached = host.read_cached(CHOICE_FILE)  # again: one_row_kernel stored its choice since the first read
    # A verdict timed beside a running session (a background build) is kept only when it is "compiled": the
    # session's own forwards slow the compiled probe. One timed under load is provisional (taken again at the next
    # quiet start), and never replaces a quiet one another process kept meanwhile.
    if not (background and choice == "eager") and load.replaces(cached.get(key), verdict):
        cached[key] = verdict
        host.store_cached(CHOICE_FILE, cached)
    if choice == "eager":
        del runner  # its copies go as the originals come back: restore frees each once it is rebuilt
        restore_originals(model)
        return ForwardChoice("eager", why, provisional=load.provisional(verdict)), None
    packed_linear.drop_packs(model)  # the probe's packs for transformers' forward, which the compiled one never reads
    return ForwardChoice("compiled", f"{why}; {how}", pieces, compile_s, provisional=load.provisional(verdict)), runner


def kept_why(decided: dict, default: str) -> str:
    """A kept verdict's why (its figures and load since loads are recorded; an older one's: that it says no load).
    Whether it is provisional, the choice says (ForwardChoice.provisional)."""
    why = decided.get("why", default)
    return why if isinstance(decided.get("load"), dict) else f"{why}; {load.describe(None)}"


def _family(model) -> tuple[type, str | None]:
    """The fast forward's class for this model's family, and None or why the model cannot run it."""
    kind = getattr(model.config, "model_type", None)
    if kind == "gpt2":
        return gpt2.GPT2Forward, gpt2.unsupported_reason(model)
    if kind not in llama.FAMILIES:
        return llama.FastForward, f"model type {kind!r} is not one of {', '.join(llama.FAMILIES)} or gpt2"
    return llama.FastForward, llama.unsupported_reason(model)


def _how_built(runner) -> str:
    """'built ahead of time (loaded)' / '(built in N s)', or 'torch.compile': for --verbose and the profile."""
    if runner.backend != "aot":
        return "torch.compile"
    functions = [getattr(fns, name) for fns in (runner.fns, runner.fns_rows) for name in llama._Fns.NAMES]
    states = sorted({fn.built for fn in functions if fn.built})
    return f"built ahead of time ({', '.join(states) or 'not yet run'})"


def _warm(runner) -> None:
    """Compile (or load from the disk cache) the graphs of one row and of several before the first timed step."""
    cache = runner.new_cache()
    runner(torch.zeros(5, dtype=torch.long), cache, 1)  # a prefill: several rows, then the head of one
    runner(torch.zeros(1, dtype=torch.long), cache, 1)  # one row
    runner(torch.zeros(5, dtype=torch.long), cache, 5)  # a verify: the head of several rows


def _probe_forward(lm, runner, eager_ms: float | None = None) -> Probe:
    """Median one-token forward, compiled against transformers' (with packed_linear), interleaved until they separate;
    or the compiled one alone where `eager_ms` was timed before the runner existed (_time_eager: a model too big to
    hold twice)."""
    if eager_ms is not None:
        alone = interleaved({"compiled": _compiled_step(runner)})
        return Probe({**alone.ms, "eager": eager_ms}, alone.rounds, None)
    return interleaved({"compiled": _compiled_step(runner), "eager": _eager_step(lm)})


def _time_eager(lm) -> float:
    return interleaved({"eager": _eager_step(lm)}).ms["eager"]


def _compiled_step(runner):
    """A one-token step of the compiled forward after a 16-token prefix, undone after each call."""
    static = runner.new_cache()
    with torch.inference_mode():
        runner(torch.zeros(16, dtype=torch.long), static, 1)

    def step() -> None:
        runner(torch.zeros(1, dtype=torch.long), static, 1)
        static.crop(-1)

    return step


def _eager_step(lm):
    """The same step on transformers' forward, with packed_linear's packs (as `--compile off` runs it)."""
    from transformers import DynamicCache

    restore_originals(lm.model)  # transformers' forward and its packs read the originals (released as made)
    packed_linear.install(lm.model)
    dynamic = DynamicCache(config=lm.model.config)
    with torch.inference_mode(), packed_linear.active():
        lm.model(input_ids=torch.zeros(1, 16, dtype=torch.long), past_key_values=dynamic, use_cache=True,
                 logits_to_keep=1)
    one = torch.zeros(1, 1, dtype=torch.long)

    def step() -> None:
        lm.model(input_ids=one, past_key_values=dynamic, use_cache=True, logits_to_keep=1)
        dynamic.crop(-1)  # transformers 5.x crops by a negative count

    return step


@dataclass
class Probe:
    """interleaved's result: each candidate's median ms, the rounds timed, and whether the fastest separated from
    the rest (None: one candidate, nothing to separate)."""

    ms: dict
    rounds: int
    separated: bool | None

    def said(self) -> str:
        if self.separated is False:
            return f"probe, {self.rounds} rounds: they did not separate"
        return f"probe, {self.rounds} rounds"


MIN_ROUNDS, MAX_ROUNDS = 7, 35  # rounds a probe times at least, and at most while its candidates do not separate
PROBE_BUDGET_S = 20.0  # ...or until this long has gone by


def interleaved(steps: dict, min_rounds: int = MIN_ROUNDS, max_rounds: int = MAX_ROUNDS,
                budget_s: float = PROBE_BUDGET_S) -> Probe:
    """Each step's median ms, the steps interleaved round by round (a machine whose speed drifts moves them alike;
    the first round warms up), repeated past `min_rounds` until the fastest separates from the next (separated),
    up to `max_rounds` or `budget_s`."""
    times: dict[str, list[float]] = {name: [] for name in steps}
    t_start = time.perf_counter()
    with torch.inference_mode(), packed_linear.active():
        for i in range(max_rounds + 1):
            for name, step in steps.items():
                t0 = time.perf_counter()
                step()
                if i:
                    times[name].append(time.perf_counter() - t0)
            if i >= min_rounds and (separated(times) is not False or time.perf_counter() - t_start > budget_s):
                break
    rounds = min(len(values) for values in times.values())
    return Probe({name: statistics.median(values) * 1000 for name, values in times.items()}, rounds, separated(times))


def separated(times: dict[str, list[float]]) -> bool | None:
    """Whether the candidate of the lowest median is apart from the next: its upper quartile below the next one's
    lower quartile (None for one candidate)."""
    if len(times) < 2:
        return None
    ranked = sorted(times.values(), key=statistics.median)
    fastest, next_one = (statistics.quantiles(values, n=4) for values in ranked[:2])
    return fastest[2] < next_one[0]


def one_row_kernel(model, runner, say=lambda msg: None) -> str:
    """'reduce', 'mm' or 'packed': the one-row product of this model's dense weights in its compiled forward
    (`runner`), whichever gives the fastest one-token forward here. 'reduce' is a multiply-and-sum inductor
    vectorizes, 'mm' F.linear (MKL's product), 'packed' each piece's packed copy where packed_linear's probe found
    its kernel best for one row (MLAS, the thin kernels or oneDNN), else F.linear: a candidate where some piece has such a
    copy. The whole forward is timed with each, not one product: a product timed alone misleads (the reduce can
    beat MKL on a mid-sized matrix called alone and lose the forward, whose bytes sit mostly in the fused gate/up
    and the head; which wins differs between CPUs). A probe
    leaves `runner` on the last kind it timed: the caller sets the choice (runner.set_one_row)."""
    products = runner.products()
    dense = [w for w in products if w[0] == "dense"]
    if not dense:  # every product runs an int4 kernel (packed_linear.int4_kernel): nothing to choose
        return "mm"
    packed = sorted({packed_linear.label(packed_linear.kernel_of(w[2])) for w in dense if w[2] is not None and w[4]})
    kinds = ("reduce", "mm") + (("packed",) if packed else ())
    # another set of candidates (or onnxruntime's version): measured again
    named = "+".join(kinds) + "".join(f"/{label}" for label in packed)
    if any(w[0] == "int8" for w in products):  # a head read as int8 codes: other bytes to weigh
        named += "/int8 head"
    cached = host.read_cached(CHOICE_FILE)
    key = f"{_key(model, 'one_row_forward')}/{named}/{packed_linear.probe_label()}"
    if (isinstance(cached.get(key), dict) and cached[key].get("kernel") in kinds
            and not load.retake(cached[key], torch.get_num_threads())):
        return cached[key]["kernel"]
    say(f"timing the one-token forward with each one-row product ({', '.join(kinds)}): once on a machine")
    with load.watch(torch.get_num_threads()) as watched:
        probe = _probe_one_row(runner, kinds)
    kernel = min(probe.ms, key=probe.ms.get)
    verdict = {"kernel": kernel, **{f"{name}_ms": value for name, value in probe.ms.items()}, "rounds": probe.rounds,
               "separated": probe.separated, "load": watched.load, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    cached = host.read_cached(CHOICE_FILE)
    if load.replaces(cached.get(key), verdict):
        cached[key] = verdict
        host.store_cached(CHOICE_FILE, cached)
    return kernel


def _probe_one_row(runner, kinds: tuple[str, ...]) -> Probe:
    """{kind: median ms} of `runner`'s one-token forward after a 16-token prefix with each one-row product,
    interleaved round by round until they separate (interleaved). The first round builds (or loads) each kind's
    one-row functions and is not counted."""
    cache = runner.new_cache()
    with torch.inference_mode():
        runner(torch.zeros(16, dtype=torch.long), cache, 1)
    one = torch.zeros(1, dtype=torch.long)

    def step_with(kind: str):
        def step() -> None:
            runner.set_one_row(kind, keep_others=True)
            runner(one, cache, 1)
            cache.crop(-1)
        return step

    return interleaved({kind: step_with(kind) for kind in kinds}, min_rounds=9)


def products_ms(model, rows: tuple[int, ...]) -> dict[str, float] | None:
    """{str(rows): ms} for each row count: the time of a forward's matrix products alone, with the kernels its
    forward runs, over the model's own weights (streamed from memory as in a forward, the head included), best of
    5 (a figure taken while another process held the CPU stays in the cache: the roofline drops one above its
    forward's own time). What the roofline sets beside a forward's memory floor: where these take most of the forward, its kernels
    bound it on this CPU (torch's int4 kernel has no fast path on some ISAs and gets through its codes far below
    the memory's pace), not the operators between them. None for a model on transformers' forward (its products are modules
    of its own) or where timing them fails (the roofline goes without). Measured once per machine, torch, threads
    and the forward's pieces (each one's shape, dtype and kernels: an `@int4` head and an `@int4+head` one, packed
    and stock copies, are other products), kept in CHOICE_FILE."""
    runner = llama.runner_for(model)
    if runner is None:
        return None
    pieces = json.dumps([runner.compiled, runner.gemv, runner.pieces(), len(runner.products()), onnx_mlas.version(),
                         thin_kernels.version(), thin_kernels.int4_version(), thin_kernels.int8_version()], sort_keys=True)
    key = f"{_key(model, 'products')}/{hashlib.sha256(pieces.encode()).hexdigest()[:16]}"
    cached = host.read_cached(CHOICE_FILE)
    entry = cached.get(key) if isinstance(cached.get(key), dict) else {}
    missing = [r for r in rows if not host.positive_number(entry.get(str(r)))]
    if missing:
        try:
            measured = {str(r): _time_products(runner, r) for r in missing}
        except Exception:  # noqa: BLE001 - a product that will not compile or run here: no figure, not a failed run
            return None
        entry = {**entry, **measured, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        cached = host.read_cached(CHOICE_FILE)
        cached[key] = entry
        host.store_cached(CHOICE_FILE, cached)
    return {str(r): entry[str(r)] for r in rows}


def _time_products(runner, rows: int, repeats: int = 5) -> float:
    """ms of one pass of `rows` rows through every product of `runner`'s forward, as its functions run them: one
    row with the one-row kernel (the compiled reduce where that is the choice), several with the packed copies."""
    one_row = rows == 1 and runner.compiled
    gemv = runner.gemv if one_row else "packed"
    compiled = aot_compile.compile_fn(llama_layers.linear) if one_row and gemv == "reduce" else None
    inputs: dict[int, torch.Tensor] = {}  # one input per width: a model has three or four
    calls = []
    for w in runner.products():
        features = w[2].shape[0] * w[3] if w[0] == "int4" else w[1].shape[1]
        if features not in inputs:
            inputs[features] = torch.randn(rows, features, dtype=runner.dtype)
        product = compiled if compiled is not None and w[0] == "dense" else llama_layers.linear
        calls.append((product, inputs[features], w))
    best = float("inf")
    with torch.inference_mode():
        for _ in range(repeats + 1):  # the first pass compiles and warms up
            t0 = time.perf_counter()
            for product, x, w in calls:
                product(x, w, gemv)
            best = min(best, time.perf_counter() - t0)
    return best * 1000
