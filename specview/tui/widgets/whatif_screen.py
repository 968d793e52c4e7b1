"""`w`: the current run replayed at other K and draft policies, for every drafter (docs/design/whatif-and-calibrate.md): tokens
per step, acceptance, predicted speedup and where each step's time is lost. The figures come from the
backend (analysis/whatif.py's `specview.whatif/1`), so the screen only lays them out."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.binding import Binding

from specview.tui.widgets.scroll_modal import ScrollModal


def _fmt(value, pattern: str = "{:.2f}") -> str:
    return "n/a" if value is None else pattern.format(value)


def drafter_table(spec: str, entry: dict) -> Table:
    t = Table(title=Text(f"{spec}  ·  costs: {entry.get('costs') or 'none'}", style="bold"), title_justify="left",
              box=None, pad_edge=False, padding=(0, 1))
    for col in ("policy", "K", "tok/step", "accept", "speedup", "lost ms/step: drafts", "rows", "overhead"):
        t.add_column(col, justify="left" if col == "policy" else "right")
    for r in list(entry.get("replays") or []) + [entry.get("oracle") or {}]:
        if not r:
            continue
        lost = r.get("lost_ms_per_step") or {}
        t.add_row(r.get("policy", "") + ("" if r.get("exact", True) else " ~"),
                  str(r.get("k")) if r.get("policy") != "oracle" else f"≤{r.get('k')}",
                  _fmt(r.get("tokens_per_step")), _fmt(r.get("acceptance_rate"), "{:.0%}"),
                  _fmt(r.get("speedup"), "{:.2f}x"), _fmt(lost.get("drafts_thrown_away"), "{:.1f}"),
                  _fmt(lost.get("verify_rows_wasted"), "{:.1f}"), _fmt(lost.get("overhead_outside_forwards"), "{:.1f}"),
                  style="dim" if r.get("policy") == "oracle" else None)
    return t


def whatif_view(figures: dict) -> Group:
    rec = figures.get("recorded") or {}
    head = Text(f"{figures.get('tokens')} tokens of this run, "
                f"{'greedy: exact' if figures.get('greedy') else 'sampling: expectations'}; measured "
                f"{_fmt(rec.get('tokens_per_step'))} tokens/step at K={rec.get('k')}. "
                + ("Costs from this machine's cost curve." if figures.get("cost_curve")
                   else "No cost curve for this machine (specview calibrate): costs from this run."), style="dim")
    return Group(head, *[drafter_table(spec, entry) for spec, entry in (figures.get("drafters") or {}).items()])


class WhatIfScreen(ScrollModal):
    BINDINGS = [Binding("escape,w,q", "dismiss", "Close")]
    DEFAULT_CSS = "WhatIfScreen > VerticalScroll { width: 100; }"
    box_title = "what if: this run at other K and policies"

    def __init__(self, figures: dict):
        super().__init__()
        self.figures = figures

    def body(self) -> Group:
        return whatif_view(self.figures)
