"""Why the speedup is what it is, in plain sentences (docs/design/diagnosis-and-check.md).

Every number in a sentence comes from the measured figures (acceptance, c, v, t_ar, the roofline), never
from a constant: the formulas are metrics.py's (E(K), E / (K c + v), break-even c), the floors
profiling/roofline.py's. `report` shows these for a profile or bench file, `bench` after its table, the
TUI on its help screen. No torch, no textual.

    figures = Figures.from_profile(doc)     # or from_bench(doc), or built from the TUI's live stats
    for sentence in diagnose(figures): print(sentence)
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from specview.core import host
from specview.core.metrics import CostCurve, CostModel, best_k, break_even_cost
from specview.core.settings import K_LIMIT

MIN_MAX_K = 8  # K tried when predicting the best one: 1 to max(8, 2 K). Without a cost curve v is the one
# measured at K, and a longer verify costs more, so predictions far from the measured K would overstate it.
CLOSE = 1.01  # predictions within 1% of each other are not worth a change


@dataclass(frozen=True)
class Figures:
    alpha: float | None  # per-token acceptance
    e: float | None  # tokens emitted per target forward, measured
    k_drafted: float | None  # drafts per step actually made
    k: int | None  # the K asked for
    c: float | None  # draft cost per drafted token / t_ar
    v: float | None  # verify cost / t_ar
    t_ar_ms: float | None  # one-token target forward
    target: dict | None = None  # summary.roofline["target"]: bytes, floor_ms, ms, share, above_ms, forwards
    draft: dict | None = None  # summary.roofline["draft"] (n-gram: 0 bytes, no forwards)
    bandwidth_gbs: float | None = None
    speculative: bool = True
    curve: CostCurve | None = None  # this machine's cost curve (`specview calibrate`): v by K for predictions

    @classmethod
    def from_profile(cls, doc: dict) -> Figures:
        s, meta = doc.get("summary") or {}, doc.get("meta") or {}
        roof = s.get("roofline") or {}
        return cls(s.get("alpha"), s.get("mean_emitted_per_step"), s.get("drafted_per_step"), meta.get("k"),
                   s.get("cost_ratio"), s.get("verify_cost_ratio"), s.get("t_ar_ms"), roof.get("target"),
                   roof.get("draft"), roof.get("bandwidth_gbs"), meta.get("method", "speculative") == "speculative",
                   host.cached_curve(host.profile_cost_key(meta)))

    @classmethod
    def from_bench(cls, doc: dict) -> Figures:
        roof = doc.get("roofline") or {}
        return cls(doc.get("alpha"), doc.get("mean_emitted_per_step"), doc.get("drafted_per_step"), doc.get("k"),
                   doc.get("cost_ratio"), doc.get("verify_cost_ratio"), doc.get("target_ms_per_token"),
                   roof.get("target"), roof.get("draft"), roof.get("bandwidth_gbs"), True,
                   host.cached_curve(host.profile_cost_key(doc.get("meta") or {})))

    @property
    def ks(self) -> range:
        # a K past K_LIMIT comes from a damaged file: 10**19 made the search list eat the memory (report was killed)
        return range(1, max(MIN_MAX_K, 2 * min(self.k or 1, K_LIMIT)) + 1)

    def model(self, **changes) -> CostModel:
        """The cost model of these figures (K = the drafts actually made), with `changes` applied."""
        base = CostModel(self.t_ar_ms, None, None, self.c, self.v, self.e, self.k_drafted, self.curve)
        return replace(base, **changes)


def diagnose(f: Figures) -> list[str]:
    """The sentences, most telling first: break-even cost, best K, each forward against its floor, the
    change that would help most. Sentences whose figures are missing are left out."""
    out = []
    if f.speculative:
        out += [s for s in (break_even(f), best_k_sentence(f)) if s]
    out += [s for s in (floor_sentence("target", f.target, f.bandwidth_gbs, f.speculative, f.t_ar_ms),
                        floor_sentence("draft", f.draft, f.bandwidth_gbs, True)) if s]
    if f.speculative:
        change = best_change(f)
        if change:
            out.append(change)
    return out


def break_even(f: Figures) -> str | None:
    c_star = break_even_cost(f.e, f.v, f.k_drafted)
    if c_star is None or f.c is None:
        return None
    k = f"{f.k_drafted:.0f}" if f.k_drafted == int(f.k_drafted) else f"{f.k_drafted:.2f} (drafts made per step)"
    how = f"c* = (E - v) / K with E {f.e:.2f} tokens per step, v {f.v:.2f}, K {k}"
    if c_star <= 0:
        return (f"Even a free draft could not gain at this acceptance: a step emits {f.e:.2f} tokens while its "
                f"verify costs {f.v:.2f} target tokens ({how}).")
    theory = f.model().theoretical_speedup
    verdict = "so it gains" if f.c < c_star else "so it cannot gain"
    return (f"Speculative decoding gains only if a drafted token costs less than {c_star:.2f} of a target token "
            f"({how}); yours costs {f.c:.2f}, {verdict}: {theory:.2f}x in theory.")


def best_k_sentence(f: Figures) -> str | None:
    model = f.model()
    best = best_k(model, f.alpha, f.ks)
    if best is None or f.k is None:
        return None
    k, speed = best
    now = model.predicted(f.alpha, f.k)[1]
    basis = f"K from 1 to {f.ks[-1]}, E(K) from alpha {f.alpha:.3f}, c {f.c:.2f} and v {f.v:.2f} as measured"
    if f.curve is not None:
        basis = (f"K from 1 to {f.ks[-1]}, E(K) from alpha {f.alpha:.3f}, c {f.c:.2f} as measured, v by K from this "
                 f"machine's cost curve ({f.curve.v(1):.2f} at K=1 to {f.curve.v(f.ks[-1]):.2f} at K={f.ks[-1]})")
    if speed <= 1:
        return (f"No K is predicted to beat plain decoding with this draft: the best, K={k}, gives {speed:.2f}x "
                f"({basis}).")
    if k == f.k:
        return f"The best K by prediction is the one in use, K={k}: {speed:.2f}x ({basis})."
    if now is not None and speed <= now * CLOSE:
        return (f"K={f.k} is within 1% of the best K by prediction (K={k}, {speed:.3f}x against {now:.3f}x; "
                f"{basis}).")
    return f"The best K by prediction is {k}: {speed:.2f}x, against {now:.2f}x at K={f.k} ({basis})."


def floor_sentence(role: str, fig: dict | None, bandwidth_gbs: float | None, speculative: bool,
                   t_ar_ms: float | None = None) -> str | None:
    if not fig or not bandwidth_gbs:
        return None
    if role == "draft" and not fig.get("bytes"):
        return "The drafts come from n-gram lookup: no forward, no weights read." if fig.get("bytes") == 0 else None
    if fig.get("ms") is None or fig.get("floor_ms") is None:
        return None
    which = ("The target's verify forward" if speculative else "The target's one-token forward") \
        if role == "target" else "The draft's one-token forward"
    return (f"{which} takes {fig['ms']:.1f} ms; reading its {fig['bytes'] / 1e6:.0f} MB of weights and KV cache at "
            f"{bandwidth_gbs:.1f} GB/s takes {fig['floor_ms']:.1f} ms, so it runs at {fig['share']:.0%} of the "
            f"memory bandwidth and {fig['above_ms']:.1f} ms of each forward is above the floor "
            + _above_floor(fig, bandwidth_gbs)
            + (f" A one-token target forward (t_ar) takes {t_ar_ms:.1f} ms against about the same floor "
               f"({fig['floor_ms'] / t_ar_ms:.0%} of the bandwidth)." if role == "target" and speculative and t_ar_ms
               else ""))


KERNEL_BOUND = 0.5  # the products take at least half the forward...
SLOW_KERNELS = 0.7  # ...and read the weights at under 70% of the bandwidth: the kernels' arithmetic bounds it


def _above_floor(fig: dict, bandwidth_gbs: float) -> str:
    """What the time above the floor is spent on: the matrix products' kernels (where their time alone was
    measured, forward_choice.products_ms) or the operators between them."""
    products, weights = fig.get("products_ms"), fig.get("weight_bytes")
    if not host.positive_number(products) or not host.positive_number(weights):
        # Not timed apart (transformers' forward, a draft llama.cpp runs): the kernels cannot be told from the rest
        return ("(time not spent reading memory: the matmuls' own arithmetic or the small operators between them, "
                "dispatch, Python; the products were not timed apart for this forward).")
    rest = fig["ms"] - products
    rest = f"; the rest, {rest:.1f} ms, is the operators between them, dispatch, Python" if rest >= 0.05 else ""
    rate = weights / products / 1e6
    timed = (f"of its {fig['ms']:.1f} ms, the matrix products alone take {products:.1f} ms with the kernels it "
             f"runs (timed apart on its own weights), getting through the weights at {rate:.1f} GB/s")
    if products >= KERNEL_BOUND * fig["ms"] and rate < SLOW_KERNELS * bandwidth_gbs:
        return f"({timed}: on this CPU those kernels, not memory, bound this forward{rest})."
    return f"({timed}{rest})."


def candidates(f: Figures) -> list[tuple[float, str]]:
    """(predicted speedup at its best K, what to change) for each change the figures can price."""
    model = f.model()
    out = []

    def add(words: str, m: CostModel, alpha: float | None = f.alpha) -> None:
        best = best_k(m, alpha, f.ks)
        if best is not None:
            out.append((best[1], f"{words} would give {best[1]:.2f}x (at K={best[0]})"))

    best = best_k(model, f.alpha, f.ks)
    now = model.predicted(f.alpha, f.k)[1] if f.k else None
    if best is not None and best[0] != f.k and now is not None and best[1] > now * CLOSE:
        out.append((best[1], f"K={best[0]} instead of {f.k} would give {best[1]:.2f}x"))
    draft = f.draft or {}
    if draft.get("floor_ms") is not None and f.t_ar_ms and f.c is not None:
        c_floor = draft["floor_ms"] / f.t_ar_ms
        if c_floor < f.c:
            add(f"a draft running at its memory floor (c {c_floor:.2f} instead of {f.c:.2f})", replace(model, c=c_floor))
    if f.v is not None and f.v > 1:
        add(f"a verify as cheap as a one-token forward (v 1.00 instead of {f.v:.2f})", replace(model, v=1.0, curve=None))
    if f.alpha is not None and f.alpha < 0.99:
        add(f"a draft the target always accepts (alpha 1 instead of {f.alpha:.3f})", model, alpha=1.0)
    return out


def best_change(f: Figures) -> str | None:
    found = candidates(f)
    now = f.model().predicted(f.alpha, f.k)[1] if f.k and f.alpha is not None else None
    if not found or now is None:
        return None
    speed, words = max(found)
    if speed <= now * CLOSE:
        return f"No single change priced here helps: {now:.2f}x predicted at K={f.k} is the best of them."
    return f"The change that would help most: {words}, against {now:.2f}x predicted now."

