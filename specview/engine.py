"""Speculative decoding (Leviathan et al. 2023, Chen et al. 2023) and its autoregressive baseline.

    decoder = Decoder(target, draft, SamplingConfig(temperature=0.6), k=4, seed=0)
    run = decoder.start(prompt_ids, max_new_tokens=64)
    while not run.done:
        step = run.step()          # -> StepResult

`draft=None` gives the autoregressive baseline through the same code path (same forward, same
cache helper, same sampling function). Invariant between steps, for each model:
its KV cache holds every token but the last ones not yet fed (`tokens[cache_len:]`, 1 or 2 tokens),
so a step never re-runs the prefix.
"""

from __future__ import annotations

import time

import torch

from specview import fastlinear
from specview.events import RunSummary, StepResult
from specview.memory import memory_mb
from specview.models import LoadedModel, vocab_limit
from specview.sampling import probs_from_logits, sample
from specview.settings import SamplingConfig
from specview.timing import PhaseTimer

RESIDUAL_TOP = 5  # residual candidates reported at a rejection


def new_cache(lm: LoadedModel):
    from transformers import DynamicCache

    return DynamicCache(config=lm.model.config)


def crop_cache(cache, keep: int) -> None:
    """Drop cached positions past `keep`. Works on transformers 4.x and 5.x: 5.x's crop refuses a
    positive length, both accept a negative count to remove; crop(0) must be avoided."""
    length = cache.get_seq_length()
    if keep < length:
        cache.crop(keep - length)


class Decoder:
    """A target, an optional draft, sampling settings and one random generator shared by all runs."""

    def __init__(
        self,
        target: LoadedModel,
        draft: LoadedModel | None,
        sampling: SamplingConfig,
        k: int = 4,
        seed: int = 0,
        timer: PhaseTimer | None = None,
        ignore_eos: bool = False,
    ):
        self.target, self.draft, self.sampling, self.k = target, draft, sampling, k
        self.device = target.device
        # One generator seeded once: runs follow each other on it, so R runs are R independent samples.
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self.timer = timer or PhaseTimer(self.device)
        self.vocab = vocab_limit(target, draft)
        limits = [m.context_len for m in (target, draft) if m is not None and m.context_len]
        self.context_len = min(limits) if limits else None
        self.eos_ids = set() if ignore_eos else eos_token_ids(target)
        self.runs = 0
        for lm in (target, draft):  # packed-weight matmuls (fastlinear), switched on only inside forward()
            if lm is not None:
                fastlinear.install(lm.model)

    @property
    def method(self) -> str:
        return "speculative" if self.draft is not None else "autoregressive"

    def start(self, prompt_ids: list[int], max_new_tokens: int) -> Run:
        run = Run(self, list(prompt_ids), max_new_tokens, self.runs)
        self.runs += 1
        return run

    def generate(self, prompt_ids: list[int], max_new_tokens: int):
        run = self.start(prompt_ids, max_new_tokens)
        while not run.done:
            yield run.step()

    @torch.inference_mode()
    def forward(self, lm: LoadedModel, cache, ids: list[int] | torch.Tensor, keep: int | None = None) -> torch.Tensor:
        """Feed ids (appending to cache) -> logits [n, vocab] of the last `keep` positions (all if None)."""
        if not isinstance(ids, torch.Tensor):
            ids = torch.tensor(ids, dtype=torch.long, device=self.device)
        with fastlinear.active():
            out = lm.model(input_ids=ids.view(1, -1), past_key_values=cache, use_cache=True, logits_to_keep=keep or 0)
        return out.logits[0, :, : self.vocab]


def accept_test(r: torch.Tensor, px: torch.Tensor, qx: torch.Tensor) -> torch.Tensor:
    """r <= p(x)/q(x), multiplied out (q(x) > 0: x was drawn from q): accept with probability min(1, p/q)."""
    return r * qx <= px


def residual_distribution(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p - q)): what to draw from after a rejection. p == q leaves no mass: use p."""
    residual = (p - q).clamp(min=0)
    mass = residual.sum()
    return torch.where(mass > 0, residual / mass.clamp(min=1e-30), p)


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
    """One generation: prompt -> up to max_new_tokens, one step() at a time. `k` may change between steps."""

    def __init__(self, decoder: Decoder, prompt_ids: list[int], max_new_tokens: int, index: int):
        if not prompt_ids:
            raise ValueError("empty prompt: start from the tokenizer's BOS token")
        self.dec = decoder
        self.k = decoder.k
        self.tokens = list(prompt_ids)
        self.prompt_len = len(prompt_ids)
        self.max_new_tokens = max_new_tokens
        self.summary = RunSummary(run=index, prompt_len=len(prompt_ids))
        self.done = False
        self.stop_reason: str | None = None
        self.target_cache = new_cache(decoder.target)
        self.draft_cache = new_cache(decoder.draft) if decoder.draft is not None else None
        self._prefilled = False  # the first step() prefills, so start() is instant and interruptible

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    def _prefill(self) -> None:
        """Fill both caches with the prompt but its last token (the first step feeds that one)."""
        t0 = time.perf_counter()
        head = self.tokens[:-1]
        if head:
            self.dec.forward(self.dec.target, self.target_cache, head, keep=1)
            if self.draft_cache is not None:
                self.dec.forward(self.dec.draft, self.draft_cache, head, keep=1)
        self.summary.prefill_ms = (time.perf_counter() - t0) * 1000
        self._prefilled = True

    def block_size(self) -> int:
        """Drafts this step: K, but none past N (the last token comes from the target) or the context."""
        k = self.k if self.draft_cache is not None else 0
        k = min(k, self.max_new_tokens - len(self.generated) - 1)
        if self.dec.context_len:
            k = min(k, self.dec.context_len - len(self.tokens) - 1)
        return max(k, 0)

    def step(self) -> StepResult:
        if self.done:
            raise RuntimeError("this run has ended")
        dec, timer = self.dec, self.dec.timer
        if not self._prefilled:
            self._prefill()
        timer.start_step()
        k = self.block_size()
        drafts, q_rows = self._draft(k) if k else ([], [])
        with timer.phase("verify"):
            fed = self.tokens[self.target_cache.get_seq_length() :]
            ids = torch.tensor(fed, dtype=torch.long, device=dec.device)
            if drafts:
                ids = torch.cat([ids, torch.stack(drafts)])
            logits = dec.forward(dec.target, self.target_cache, ids, keep=k + 1)
        with timer.phase("sample"):
            decision = self._decide(logits, drafts, q_rows)
        result = self._emit(k, decision)
        with timer.phase("cache"):
            keep = len(self.tokens) - 1
            crop_cache(self.target_cache, keep)
            if self.draft_cache is not None:
                crop_cache(self.draft_cache, keep)
        result.phases_ms, result.wall_ms = timer.end_step()
        result.memory_mb = memory_mb(dec.device)
        self.summary.add(result)
        return result

    def _draft(self, k: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """k tokens from the draft, each fed back without leaving the device; returns ids and their q rows."""
        dec, timer = self.dec, self.dec.timer
        drafts, q_rows = [], []
        ids: list[int] | torch.Tensor = self.tokens[self.draft_cache.get_seq_length() :]
        for _ in range(k):
            with timer.phase("draft"):
                logits = dec.forward(dec.draft, self.draft_cache, ids, keep=1)[-1]
            with timer.phase("sample"):
                with timer.phase("softmax"):
                    q = probs_from_logits(logits, dec.sampling)
                token = sample(q, dec.generator, dec.sampling.greedy)
            drafts.append(token)
            q_rows.append(q)
            ids = token.view(1)
        return drafts, q_rows

    def _decide(self, logits: torch.Tensor, drafts: list[torch.Tensor], q_rows: list[torch.Tensor]) -> list[float]:
        """The accept test, the residual / bonus draw, all on the device; ONE transfer to the host.

        Returns [n, extra, d_1..d_k, p(d_i).., q(d_i).., r_i.., top ids.., top probs..] as floats.
        """
        dec = self.dec
        greedy = dec.sampling.greedy
        with dec.timer.phase("softmax"):
            p = probs_from_logits(logits, dec.sampling)  # [k+1, V]
        k = len(drafts)
        if k:
            d = torch.stack(drafts)
            q = torch.stack(q_rows)
            rows = torch.arange(k, device=dec.device)
            px, qx = p[rows, d], q[rows, d]
            if greedy:
                r = torch.zeros(0, device=dec.device)
                ok = d == p[:k].argmax(dim=-1)
            else:
                r = torch.rand(k, generator=dec.generator, device=dec.device)
                ok = accept_test(r, px, qx)
            n = ok.long().cumprod(0).sum()
            p_n = p.index_select(0, n.view(1))[0]
            q_n = q.index_select(0, n.clamp(max=k - 1).view(1))[0]
            # After k acceptances p_n is the target's (k+1)-th row: the bonus distribution.
            dist = p_n if greedy else torch.where(n < k, residual_distribution(p_n, q_n), p_n)
        else:
            d = px = qx = r = torch.zeros(0, device=dec.device)
            n = torch.zeros((), dtype=torch.long, device=dec.device)
            dist = p[0]
        extra = sample(dist, dec.generator, greedy)
        top = torch.topk(dist, min(RESIDUAL_TOP, dist.shape[-1]))
        packed = [n.view(1), extra.view(1), d, px, qx, r, top.indices, top.values]
        return torch.cat([t.to(torch.float64) for t in packed]).tolist()

    def _emit(self, k: int, decision: list[float]) -> StepResult:
        greedy = self.dec.sampling.greedy
        n, extra = int(decision[0]), int(decision[1])
        pos = 2
        drafted = [int(x) for x in decision[pos : pos + k]]
        p = decision[pos + k : pos + 2 * k]
        q = decision[pos + 2 * k : pos + 3 * k]
        pos += 3 * k
        r = None if greedy else decision[pos : pos + k]
        pos += 0 if greedy else k
        top = min(RESIDUAL_TOP, self.dec.vocab)
        top_ids, top_probs = decision[pos : pos + top], decision[pos + top : pos + 2 * top]
        rejected = n < k
        result = StepResult(
            step=self.summary.steps,
            run=self.summary.run,
            k=self.k if self.draft_cache is not None else 0,
            drafted=drafted,
            q=q,
            p=p,
            # DESIGN: r is null whenever a speculative run is greedy; an autoregressive step has r = []
            r=None if greedy and self.draft_cache is not None else (r if k else []),
            accepted=n,
            rejected_at=n if rejected else None,
            resampled=extra if rejected else None,
            residual_top=[[int(i), pr] for i, pr in zip(top_ids, top_probs)] if rejected else None,
            bonus=None if rejected else extra,
            emitted=drafted[:n] + [extra],
        )
        self._apply_stops(result)
        self.tokens.extend(result.emitted)
        result.tokens = self._texts(len(result.emitted))
        if not self.done:
            if len(self.generated) >= self.max_new_tokens:
                self._finish("length")
            elif self.dec.context_len and len(self.tokens) >= self.dec.context_len:
                self._finish("context")
        result.stop_reason = self.stop_reason
        return result

    def _apply_stops(self, result: StepResult) -> None:
        """Cut the step at the first EOS; tokens after it are dropped, and with them the resample/bonus."""
        for i, tok in enumerate(result.emitted):
            if tok in self.dec.eos_ids:
                if i < result.accepted:  # EOS among the accepted drafts: the rest of the step never happened,
                    # so the drafts after it were never tested and do not count as drafted (or rejected).
                    result.accepted = i + 1
                    result.drafted, result.q, result.p = result.drafted[: i + 1], result.q[: i + 1], result.p[: i + 1]
                    if result.r is not None:
                        result.r = result.r[: i + 1]
                    result.rejected_at = result.resampled = result.residual_top = result.bonus = None
                result.emitted = result.emitted[: i + 1]
                self._finish("eos")
                return

    def _texts(self, count: int) -> list[str]:
        """Text of each of the last `count` tokens, decoded in context so leading spaces and multi-byte
        characters come out right (a piece of an unfinished UTF-8 character shows as U+FFFD)."""
        decode = self.dec.target.tokenizer.decode
        out = []
        for i in range(len(self.tokens) - count, len(self.tokens)):
            start = max(0, i - 6)
            out.append(decode(self.tokens[start : i + 1])[len(decode(self.tokens[start:i])) :])
        return out

    def _finish(self, reason: str) -> None:
        self.done = True
        self.stop_reason = reason
        self.summary.stop_reason = reason
