"""Acceptance: overall and recent rate, per-position bars, tokens per step, measured vs theoretical speedup."""

from __future__ import annotations

from rich.text import Text

from specview.tui.render import SPARKS, bar, fmt, pct, sparkline
from specview.tui.stats import RECENT
from specview.tui.widgets.panel import StatsPanel


class AcceptancePanel(StatsPanel):
    TITLE = "acceptance"
    k = 0  # K of the next step (the prediction line)

    def render(self) -> Text:
        st, width, height = self.stats, max(self.size.width, 20), self.size.height
        out = Text(no_wrap=True, overflow="ellipsis")
        out.append("rate ", style="dim")
        out.append(pct(st.acceptance_rate), style="bold")
        out.append(f"  last{RECENT} ", style="dim")
        out.append(pct(st.recent_rate()))
        out.append("  α ", style="dim")
        out.append(fmt(st.alpha, "{:.3f}") + "\n")
        positions = st.positions
        skipped = any(u for _, _, u in positions)  # a policy (or N) left positions undrafted
        policy = st.policy not in (None, "fixed")
        if policy:
            out.append(policy_line(st) + "\n")
        if positions and height >= len(positions) + 5 + policy:
            bar_width = max(5, min(20, width - (28 if skipped else 18)))
            for i, (rate, n, undrafted) in enumerate(positions):
                out.append(f"pos {i + 1:<2} ", style="dim")
                out.append(bar(rate, bar_width, "green") if n else Text("·" * bar_width, style="dim"))
                out.append(f" {fmt(rate, '{:>4.0%}', '   -')}", style="")
                out.append(f" n={n}", style="dim")
                if undrafted:  # asked for, not drafted: neither accepted nor rejected
                    out.append(f" ∅{undrafted}", style="yellow")
                out.append("\n")
            if skipped and height >= len(positions) + 6 + policy:
                out.append("∅ = steps that did not draft it (not rejected)\n", style="dim")
        elif positions:
            out.append("by pos ", style="dim")
            out.append("".join(SPARKS[round((r or 0) * (len(SPARKS) - 1))] if n else "·" for r, n, _ in positions),
                       style="green")
            out.append(" " + " ".join(fmt(r, "{:.0%}", "-") for r, _, _ in positions) + "\n")
            if skipped:  # per position, the steps that asked for it and did not draft it: not rejections
                out.append("∅ not drafted ", style="dim")
                out.append(" ".join(str(u) for _, _, u in positions) + "\n", style="yellow")
        else:
            out.append("by pos  no steps yet\n", style="dim")
        out.append("tok/step ", style="dim")
        spark_width = max(5, width - 20)
        out.append(sparkline([float(v) for v in st.tokens_per_step], spark_width, lo=0.0), style="cyan")
        out.append(f" mean {fmt(st.mean_emitted)}\n")
        out.append("speedup ", style="dim")
        out.append(f"{fmt(st.measured_speedup, '{:.2f}x')}", style="bold")
        out.append(" est.  theory ", style="dim")
        out.append(f"{fmt(st.theoretical_speedup, '{:.2f}x')}\n", style="bold")
        out.append(f"c {fmt(st.c)}  v {fmt(st.v)}  t_ar {fmt(st.t_ar_ms, '{:.1f} ms')}\n", style="dim")
        predicted = st.predicted(self.k) if self.k else None
        if predicted:
            e, speed = predicted
            out.append(f"next K={self.k}: E {e:.2f} → theory {fmt(speed, '{:.2f}x')}", style="dim")
        out.rstrip()
        return out


STOPS = {"budget": "budget", "p-min": "p-min", "no-proposal": "no match"}


def policy_line(st) -> Text:
    """The draft-length policy at work: tokens drafted per step, and why steps stopped drafting."""
    out = Text()
    out.append(f"{st.policy} ", style="bold")
    out.append(f"{fmt(st.mean_k)}", style="")
    out.append("/step", style="dim")
    total = sum(st.stops.values())
    if total:
        out.append(" stop ", style="dim")
        out.append(" ".join(f"{STOPS.get(why, why)} {n / total:.0%}" for why, n in st.stops.items()))
    return out
