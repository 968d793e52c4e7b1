"""Speculative decoding (Leviathan et al. 2023, Chen et al. 2023) and its autoregressive baseline.

    decoder = Decoder(target, draft, SamplingConfig(temperature=0.6), k=4, seed=0)
    run = decoder.start(prompt_ids, max_new_tokens=64, k=4)     # k, sampling, ignore_eos, generator: per run
    while not run.done:
        step = run.step()          # -> StepResult; step(k=) changes K from this step on (the TUI's +/-)

`draft` is a drafter (drafters/: a model, n-gram lookup, a layer-skipping view of the target) or a
LoadedModel (wrapped in a ModelDrafter); None gives the autoregressive baseline through the same code
path (same forward, same cache helper, same sampling function). Invariant between steps: the target's
KV cache holds every token but the last one or two not yet fed (`tokens[cache_len:]`), so a step never
re-runs the prefix; a draft model's cache catches up the same way.

The engine runs each model through `lm.forward` (models/stock_forward.py): transformers' forward, or a forward of the
engine's own that a fast path installed. It never asks which fast path exists; a forward built while a run goes on
comes in through the `between_steps` hook the session passes (cpu/fast_path.py take_finished_builds).
"""

from __future__ import annotations

import itertools
import time

import torch

from specview.core.detokenize import CONTEXT, piece_in_context
from specview.core.errors import SpecviewError
from specview.core.events import RunSummary, StepResult
from specview.core.policies import make_policy, parse_policy
from specview.core.settings import SamplingConfig
from specview.engine import accept_rule, target_states, token_tree
from specview.engine import device as devices
from specview.engine.decision import Decision, ends_in_rejection
from specview.engine.drafter import ModelDrafter, Proposal, context_holders
from specview.engine.kv_cache import crop_cache, keep_rows, new_cache
from specview.engine.memory import memory_mb
from specview.engine.phase_timer import PhaseTimer
from specview.engine.sampling import probs_from_logits, sample
from specview.models.loader import LoadedModel, vocab_limit
from specview.models.placement import placed_devices

RESIDUAL_TOP = 5  # residual candidates reported at a rejection


class Decoder:
    """A target, an optional drafter, sampling settings and one random generator shared by all runs.
    `drafter` may be changed between steps (the TUI's `d`): each run keeps one state per drafter."""

    def __init__(
        self,
        target: LoadedModel,
        draft,
        sampling: SamplingConfig,
        k: int = 4,
        seed: int = 0,
        timer: PhaseTimer | None = None,
        ignore_eos: bool = False,
        policy: str = "fixed",
        cost_curve=None,
        generator: torch.Generator | None = None,
        between_steps=None,
    ):
        self.target, self.sampling, self.k = target, sampling, k
        self.policy = parse_policy(policy)  # how many of the K to draft each step (core/policies.py)
        self.cost_curve = cost_curve  # metrics.CostCurve of this machine, if calibrated: goodput prices on it
        self.device = target.device
        self.placed = placed_devices(target.model)  # --device-map: every device the target's layers sit on
        self.drafter = ModelDrafter(draft) if isinstance(draft, LoadedModel) else draft
        # One generator seeded once: runs follow each other on it, so R runs are R independent samples (a command
        # that shares one generator between decoders passes it).
        self.generator = generator or torch.Generator(device=self.device).manual_seed(seed)
        # Called with the run before each step: a forward built in the background that is ready is taken there.
        self.between_steps = between_steps
        self.timer = timer or PhaseTimer(self.device)
        self.eos_ids = set() if ignore_eos else eos_token_ids(target)
        self.runs = 0
        # What a policy learns (goodput: costs and acceptance per drafter), kept across this decoder's runs.
        self.policy_memory: dict = {}

    @property
    def drafter(self):
        return self._drafter

    @drafter.setter
    def drafter(self, drafter) -> None:
        """Set between steps (the TUI's `d`); a run keeps one state per drafter, so each picks up where
        it was. Vocabulary and context were checked for every drafter when the session loaded them."""
        self._drafter = drafter
        lm = getattr(drafter, "lm", None)
        self.vocab = vocab_limit(self.target, lm)  # logits sliced to what both models and the tokenizer share
        if not devices.on_host(self.device) and self.vocab >= devices.FLOAT32_EXACT_INTS:
            raise SpecviewError(f"a vocabulary of {self.vocab} tokens: on {self.device} the step's decision is "
                                f"packed in float32, exact for ids below 2^24 only; use --device cpu")
        holders = context_holders(self.target, [] if drafter is None else [drafter])
        limits = [m.context_len for m in holders if getattr(m, "context_len", None)]
        self.context_len = min(limits) if limits else None

    @property
    def draft(self) -> LoadedModel | None:
        """The drafter's model, if it has one (n-gram lookup has none)."""
        return getattr(self.drafter, "lm", None)

    @property
    def method(self) -> str:
        return "speculative" if self.drafter is not None else "autoregressive"

    def start(self, prompt_ids: list[int], max_new_tokens: int, *, k: int | None = None,
              sampling: SamplingConfig | None = None, ignore_eos: bool | None = None,
              generator: torch.Generator | None = None, index: int | None = None) -> Run:
        """A run of up to max_new_tokens after the prompt. K, sampling, EOS and the random stream are the run's own
        (a server's requests each bring theirs); each defaults to the decoder's. `index` names the run in its records
        (default: runs of this decoder counted from 0)."""
        run = Run(self, list(prompt_ids), max_new_tokens, self.runs if index is None else index, k=self.k if k is None else k,
                  sampling=sampling or self.sampling, generator=generator or self.generator,
                  eos_ids=self.eos_ids if ignore_eos is None else set() if ignore_eos else eos_token_ids(self.target))
        self.runs += 1
        return run

    def generate(self, prompt_ids: list[int], max_new_tokens: int, **run_options):
        run = self.start(prompt_ids, max_new_tokens, **run_options)
        while not run.done:
            yield run.step()

    @torch.inference_mode()
    def forward(self, lm: LoadedModel, cache, ids: list[int] | torch.Tensor, keep: int | None = None,
                tree: tuple[torch.Tensor, torch.Tensor] | None = None, hidden_layers: tuple[int, ...] = ()):
        """Feed ids (appending to cache) -> logits [n, vocab] of the last `keep` positions (all if None).
        `tree` = (positions, allowed) from token_tree.layout: each row at its own position, seeing only what
        `allowed` [rows, cached + rows] lets it (a token tree's rows see their ancestors, not their cousins).
        `hidden_layers`: -> (logits, the inputs of those decoder layers for every row fed, side by side [rows,
        layers * hidden]) from the same forward (engine/target_states.py: what an EAGLE-3 head reads)."""
        if not isinstance(ids, torch.Tensor):
            ids = devices.upload(ids, self.device)
        runner = lm.forward.runner  # a forward of the engine's own, installed by a fast path
        if runner is not None:
            out = runner(ids.view(-1), cache, keep or 0, tree, **({"capture": hidden_layers} if hidden_layers else {}))
            logits = (out[0] if hidden_layers else out)[:, : self.vocab]
            if self.timer.enabled:  # its norms are fused away from any hook: their modelled time (norm_ms)
                self.timer.modelled("layernorm", runner.norm_ms(ids.numel()))
            return (logits, target_states.side_by_side(out[1], self.device)) if hidden_layers else logits
        extra = {} if tree is None else tree_arguments(lm.model, *tree)
        with lm.forward.products(), target_states.layer_inputs(lm.model, hidden_layers) as states:
            out = lm.model(input_ids=ids.view(1, -1), past_key_values=cache, use_cache=True, logits_to_keep=keep or 0,
                           **extra)
        # A model spread over devices (--device-map) returns its logits on its last one (a copy between devices
        # that need not wait for the host).
        logits = out.logits[0, :, : self.vocab].to(self.device, non_blocking=True)
        return (logits, target_states.side_by_side(states, self.device)) if hidden_layers else logits


def tree_arguments(model, positions: torch.Tensor, allowed: torch.Tensor) -> dict:
    """transformers' custom 4-D mask (used as given, batch 1, one head dimension) and position ids. sdpa takes
    a boolean mask (True = attend); the eager attention adds the mask, so it gets 0 / the dtype's minimum."""
    mask = allowed[None, None]
    if getattr(model.config, "_attn_implementation", "sdpa") != "sdpa":
        dtype = getattr(model, "dtype", torch.float32)
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
    return {"attention_mask": mask, "position_ids": positions.view(1, -1)}


def stopped_by(budget: int, proposal: Proposal | None) -> str:
    """Why a speculative step drafted what it drafted: the whole budget, a p-min cut, or the drafter had
    nothing (more) to propose (n-gram lookup without a match, or a shorter one)."""
    if proposal is None:
        return "budget"  # a budget of 0 (the policy's, or N / the context leave no room)
    if proposal.cut:
        return "p-min"
    return "budget" if len(proposal) >= budget else "no-proposal"


def eos_token_ids(lm: LoadedModel) -> set[int]:
    ids = set()
    for source in (lm.model.generation_config, lm.model.config, lm.tokenizer):
        value = getattr(source, "eos_token_id", None)
        if isinstance(value, int):
            ids.add(value)
        elif isinstance(value, (list, tuple)):
            ids.update(v for v in value if isinstance(v, int))
    return ids


class Run:
    """One generation: prompt -> up to max_new_tokens, one step() at a time (step(k=) changes K between steps).
    A drafter drafts inside a run: it is handed the run, which gives it the decoder's forward, timer, device and
    vocabulary, and the run's own sampling and generator."""

    def __init__(self, decoder: Decoder, prompt_ids: list[int], max_new_tokens: int, index: int, *, k: int,
                 sampling: SamplingConfig, generator: torch.Generator, eos_ids: set[int]):
        if not prompt_ids:
            raise ValueError("empty prompt: start from the tokenizer's BOS token")
        self.dec = decoder
        self.k, self.sampling, self.generator, self.eos_ids = k, sampling, generator, eos_ids
        self.tokens = list(prompt_ids)
        self.prompt_len = len(prompt_ids)
        self.max_new_tokens = max_new_tokens
        self.summary = RunSummary(run=index, prompt_len=len(prompt_ids))
        self.done = False
        self.stop_reason: str | None = None
        self.target_cache = new_cache(decoder.target)
        self.states: dict[int, object] = {}  # id(drafter) -> its state (a KV cache), made on first use
        # Its state (heuristic's budget) is this run's; what goodput measures is the decoder's, across runs.
        self.policy = make_policy(decoder.policy, decoder.policy_memory, decoder.cost_curve,
                                  getattr(decoder.drafter, "spec", None))
        self._prefilled = False  # the first step() prefills, so start() is instant and interruptible
        self._drafters: dict[int, object] = {}  # id(drafter) -> drafter, beside `states`
        # A run that starts while a forward is built in the background records which forward each step ran.
        self.track_forwards = any(lm.forward.state() == "building" for lm in self._models())
        devices.reset_peak(decoder.device)  # memory_mb's device peak is this run's

    @property
    def timer(self) -> PhaseTimer:
        return self.dec.timer

    @property
    def device(self) -> torch.device:
        return self.dec.device

    @property
    def vocab(self) -> int:
        return self.dec.vocab

    def forward(self, lm: LoadedModel, cache, ids, keep: int | None = None, tree=None, hidden_layers=()):
        return self.dec.forward(lm, cache, ids, keep, tree, hidden_layers)

    def _models(self) -> list[LoadedModel]:
        models = [self.dec.target, self.dec.draft]
        return [lm for lm in models if lm is not None]

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def draft_cache(self):
        """The current drafter's state (a draft model's KV cache; None for n-gram lookup)."""
        return self._state(self.dec.drafter) if self.dec.drafter is not None else None

    def _state(self, drafter):
        key = id(drafter)
        if key not in self.states:
            self.states[key] = drafter.new_state()
            self._drafters[key] = drafter
        return self.states[key]

    def _drafter_key(self):
        """The drafter a policy's figures are kept for (the TUI's `d` switches between steps)."""
        return getattr(self.dec.drafter, "spec", None) or id(self.dec.drafter)

    def _prefill(self) -> None:
        """Fill the caches with the prompt but its last token (the first step feeds that one)."""
        t0 = time.perf_counter()
        head = self.tokens[:-1]
        if head:
            layers = self._target_layers()
            out = self.dec.forward(self.dec.target, self.target_cache, head, keep=1, hidden_layers=layers)
            if layers:  # the target's states of the prompt for a drafter that reads them (drafters/eagle3.py)
                self.dec.drafter.take_hidden(self._state(self.dec.drafter), 0, out[1])
            if self.dec.drafter is not None:
                self.dec.drafter.prefill(self, self._state(self.dec.drafter), head)
            devices.synchronize(self.dec.device)  # the prefill's work, not its launches (else it lands in step 1)
        self.summary.prefill_ms = (time.perf_counter() - t0) * 1000
        self._prefilled = True

    def _target_layers(self) -> tuple[int, ...]:
        """The target layers whose inputs the current drafter reads from the target's forwards (none: most drafters)."""
        return tuple(getattr(self.dec.drafter, "target_layers", ()) or ())

    def caches_by_model(self) -> list[tuple[LoadedModel, list[tuple[object, object]]]]:
        """Each model this run has stepped with and its caches here, as (key, cache) for replace_cache: the target's,
        and each draft model's drafter's (the between-steps hook moves them to a forward built meanwhile)."""
        models = [self.dec.target] + [getattr(d, "lm", None) for d in self._drafters.values()]
        out = []
        for lm in {id(m.model): m for m in models if m is not None}.values():
            caches = [("target", self.target_cache)] if lm is self.dec.target else []
            caches += [(key, self.states[key]) for key, d in self._drafters.items() if getattr(d, "lm", None) is lm]
            out.append((lm, caches))
        return out

    def replace_cache(self, key, cache) -> None:
        """Between two steps: the cache `key` (from caches_by_model) is now `cache`, holding the same positions."""
        if key == "target":
            self.target_cache = cache
        else:
            self.states[key] = cache

    def block_size(self) -> int:
        """Drafts this step: the policy's budget out of K (a tree drafter: its depth), but none past N (the
        last token comes from the target) or the context."""
        drafter = self.dec.drafter
        shape = getattr(drafter, "shape", None)
        if drafter is None:
            k = 0
        else:
            k = shape.depth(self.k) if shape is not None else self.policy.budget(self.k, self._drafter_key())
        k = min(k, self.max_new_tokens - len(self.generated) - 1)
        if self.dec.context_len:
            k = min(k, self.dec.context_len - len(self.tokens) - 1)
        return max(k, 0)

    def step(self, k: int | None = None) -> StepResult:
        """One step; `k` is K from this step on (the TUI's +/-), else the run's."""
        if self.done:
            raise RuntimeError("this run has ended")
        if k is not None:
            self.k = k
        dec, timer = self.dec, self.dec.timer
        drafter = dec.drafter
        if dec.between_steps is not None:
            dec.between_steps(self)
        if not self._prefilled:
            self._prefill()
        timer.start_step()
        k = self.block_size()
        keep_drafting = self.policy.keep_drafting if self.policy.wants_top_q else None
        proposal = drafter.propose(self, self._state(drafter), self.tokens, k, keep_drafting) if k else None
        base = len(self.tokens)  # where the drafted nodes start, in both caches
        with timer.phase("verify"):
            start = self.target_cache.get_seq_length()
            fed = self.tokens[start:]
            ids = devices.upload(fed, dec.device)
            n_drafts = len(proposal) if proposal is not None else 0
            tree = None
            if n_drafts:
                ids = torch.cat([ids, proposal.tokens])
                if proposal.parents is not None and not token_tree.is_chain(proposal.parents):
                    tree = token_tree.layout(proposal.parents, start, len(fed), dec.device)  # one forward, every node
            layers = self._target_layers()
            logits = dec.forward(dec.target, self.target_cache, ids, keep=n_drafts + 1, tree=tree, hidden_layers=layers)
            if layers:
                logits, states = logits
        with timer.phase("sample"):
            decision = self._decide(logits, proposal if n_drafts else None)
        result = self._emit(decision, proposal)
        with timer.phase("cache"):
            keep = len(self.tokens) - 1
            path = decision.path[: keep - base]
            if tree is not None:  # the accepted path's rows move up to follow the text; the rest goes
                keep_rows(self.target_cache, base, path)
            if proposal is not None and proposal.draft_rows is not None:
                # The draft's cache too, as far as it fed the path: also when a nodes= cut left a chain whose
                # levels were fed beside siblings (keep_rows only crops rows already in place).
                rows = list(itertools.takewhile(lambda row: row >= 0, (proposal.draft_rows[j] for j in path)))
                drafter.keep_rows(self._state(drafter), base, rows)
            crop_cache(self.target_cache, keep)
            if proposal is not None:  # only the drafter that drafted can be past `keep`
                drafter.rollback(self._state(drafter), keep)
            if layers:  # the target's states of the positions now in its cache: the rows fed, the accepted path
                rows = list(range(len(fed))) + [len(fed) + j for j in path]
                drafter.take_hidden(self._state(drafter), start, states[devices.upload(rows, dec.device)])
        result.phases_ms, result.wall_ms = timer.end_step()
        if self.track_forwards:
            result.forwards = {role: lm.forward.state()
                               for role, lm in (("target", dec.target), ("draft", dec.draft)) if lm is not None}
        result.timing = timer.last
        result.memory_mb = memory_mb(dec.device, dec.placed)
        if drafter is not None:
            result.policy = self.policy.spec
            result.stopped_by = stopped_by(k, proposal)
            result.budget = k
            result.cut_q = proposal.cut_q if proposal is not None else None
        self.policy.observe(result, self._drafter_key())
        self.summary.add(result)
        return result

    def _decide(self, logits: torch.Tensor, proposal: Proposal | None, host: bool | None = None) -> Decision:
        """The accept test, the residual / bonus draw, all on the device; ONE transfer to the host. (On the CPU the
        walk runs in Python, accept_rule.walk_on_host: the same decisions, without every node's residual.)

        One code path for chains and trees (a chain is a tree whose node j has parent j - 1): the nodes are
        visited in order and a node is tried when its parent is the last node accepted, against the law
        still to be matched (the target's row after its parent, or, after a sibling's rejection, the running
        residual). Accepted: the walk moves to its children. All children rejected: draw from the residual;
        no child: the bonus from the node's row. A chain draws and decides exactly as before trees."""
        dec = self.dec
        with dec.timer.phase("softmax"):
            p = probs_from_logits(logits, self.sampling)  # [n+1, V]: row 0 after the root, row 1 + j after node j
        empty = torch.zeros(0, device=dec.device)
        if proposal is None:  # nothing drafted, nothing rejected: no residual to report
            return self._decision(p[0], empty, empty, empty, empty, empty, empty, top=False)
        d, q = proposal.tokens, proposal.q
        n = len(d)
        parents = proposal.parents if proposal.parents is not None else list(range(-1, n - 1))
        above = devices.upload([parent + 1 for parent in parents], dec.device)  # each node's row of p
        px, qx = p[above, d], q[torch.arange(n, device=dec.device), d]
        if self.sampling.greedy:
            r, matches = empty, d == p.argmax(dim=-1)[above]
        else:
            r, matches = torch.rand(n, generator=self.generator, device=dec.device), None
        if host is None:  # the host walk on the CPU (tests compare both walks with `host`)
            host = devices.on_host(dec.device)
        walk = accept_rule.walk_on_host if host else accept_rule.walk_on_device
        dist, tried, accepted = walk(p, d, q, parents, qx, r, matches, self.sampling.greedy)
        # The residual's top entries are reported when the walk ended at a rejection only; on the host the walk knows
        # whether it did (a top-k of the whole vocabulary is not free on the CPU, cold after the forward)
        top = not host or ends_in_rejection(tried.tolist(), accepted.nonzero().view(-1).tolist())
        return self._decision(dist, tried, accepted, d, px, qx, r, top=top)

    def _decision(self, dist, tried, accepted, d, px, qx, r, top: bool = True) -> Decision:
        """The extra token drawn from `dist` (after the uniforms of the accept tests), its law's top entries (`top`:
        where a rejection may have happened), and everything moved to the host in one transfer."""
        extra = sample(dist, self.generator, self.sampling.greedy)
        if top:
            best = torch.topk(dist, min(RESIDUAL_TOP, dist.shape[-1]))
            top_ids, top_probs = best.indices, best.values
        else:
            top_ids = top_probs = dist[:0]
        return Decision.from_device(extra, tried, accepted, d, px, qx, r, top_ids, top_probs)

    def _emit(self, decision: Decision, proposal: Proposal | None) -> StepResult:
        """Append the step's tokens (cut at the first EOS) and build its StepResult once, from the cut."""
        greedy, speculative = self.sampling.greedy, self.dec.drafter is not None
        parents = proposal.parents if proposal is not None and decision.drafted else None
        path = decision.path
        # The accepted path and the first children below it: for a chain every node, so drafted/q/p/r keep
        # their chain meaning (a tree's other nodes are in its `tree` record).
        line = token_tree.spine(parents, path) if parents is not None else list(range(len(decision.drafted)))
        n, extra = len(path), decision.extra
        drafted = [decision.drafted[j] for j in line]
        p, q = [decision.p[j] for j in line], [decision.q[j] for j in line]
        r = [decision.r[j] for j in line] if decision.r else decision.r
        # The extra token is a resample when a child of the last accepted node was rejected (it is then the spine's
        # node n: rejected_at indexes `drafted`); a tree's sibling rejected before a later one was accepted down to a
        # leaf leaves a bonus.
        rejected = decision.rejected
        emitted = drafted[:n] + [extra]
        eos = next((i for i, tok in enumerate(emitted) if tok in self.eos_ids), None)
        if eos is not None:
            emitted = emitted[: eos + 1]
            if eos < n:  # EOS among the accepted drafts: the rest of the step never happened, so the drafts
                # after it were never tested and do not count as drafted (or rejected), nor does the extra.
                n = eos + 1
                drafted, p, q, r = drafted[:n], p[:n], q[:n], r[:n]
                rejected, extra = False, None
        self.tokens.extend(emitted)
        tree = None
        if parents is not None and not token_tree.is_chain(parents):
            tree = {"tokens": decision.drafted, "parents": list(parents), "q": decision.q, "p": decision.p,
                    "r": decision.r or None, "path": path[:n],
                    "rejected": [j for j, t in enumerate(decision.tried) if t and j not in path]}
        if eos is not None:
            self._finish("eos")
        elif len(self.generated) >= self.max_new_tokens:
            self._finish("length")
        elif self.dec.context_len and len(self.tokens) >= self.dec.context_len:
            self._finish("context")
        return StepResult(
            step=self.summary.steps,
            run=self.summary.run,
            k=self.k if speculative else 0,
            drafted=drafted,
            q=q,
            p=p,
            # docs/design/events.md: r is null whenever a speculative run is greedy; an autoregressive step has r = []
            r=None if greedy and speculative else (r if drafted else []),
            accepted=n,
            rejected_at=n if rejected else None,
            resampled=extra if rejected else None,
            residual_top=decision.residual_top if rejected else None,
            bonus=extra if not rejected else None,
            emitted=emitted,
            tokens=self._texts(len(emitted)),
            stop_reason=self.stop_reason,
            source=list(proposal.source) if proposal is not None and proposal.source else None,
            position=len(self.tokens) - len(emitted),
            tree=tree,
        )

    def _texts(self, count: int) -> list[str]:
        """Text of each of the last `count` tokens, decoded in context (detokenize.piece_in_context)."""
        decode = self.dec.target.tokenizer.decode
        return [piece_in_context(decode, self.tokens[max(0, i - CONTEXT): i], self.tokens[i])
                for i in range(len(self.tokens) - count, len(self.tokens))]

    def _finish(self, reason: str) -> None:
        self.done = True
        self.stop_reason = reason
        self.summary.stop_reason = reason
