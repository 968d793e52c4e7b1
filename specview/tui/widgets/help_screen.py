"""`?`: the keys, the colours and what the numbers mean."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.binding import Binding

from specview.tui.widgets.scroll_modal import ScrollModal

KEYS = [
    ("space", "draft and verify one block (one step)"),
    ("r", "run / pause continuous stepping"),
    ("← →", "browse earlier steps (the block view shows that step)"),
    ("+ -", "change K, the tokens drafted per step, for the next steps"),
    ("e", "export the profile now (--profile-dir)"),
    ("n", "new run from the same prompt (after a run ends)"),
    ("w", "what-if: this run replayed at other K and policies, for every drafter, with the lost time"),
    ("?", "this help"),
    ("q", "quit (also ctrl+q, ctrl+c); the profile is saved and its path printed"),
]
METRICS = [
    ("rate", "accepted draft tokens / drafted tokens"),
    ("α", "accepted / (accepted + rejections): per-token acceptance probability"),
    ("tok/step", "tokens emitted per target forward (includes the resampled or bonus token)"),
    ("t_ar", "one-token target forward, timed after loading"),
    ("c", "draft forward time per drafted token / t_ar"),
    ("v", "mean verify forward time / t_ar"),
    ("theory", "E / (K c + v): a zero-overhead engine with these models"),
    ("speedup est.", "tokens × t_ar / time of the steps"),
    ("floor", "bytes a forward reads (weights + KV cache) / memory bandwidth: the fastest it can be"),
    ("p/q, r", "a draft is accepted when r ≤ p(x)/q(x); greedy: when it is the target's argmax"),
]


def help_text(diagnosis: list[str] | None = None) -> Table:
    table = Table(box=None, show_header=False, pad_edge=False, padding=(0, 2))
    table.add_column(style="bold cyan", no_wrap=True)
    table.add_column()
    for key, what in KEYS:
        table.add_row(key, what)
    table.add_row("", "")
    table.add_row("colours", Text.assemble(("prompt", "dim"), "  ", ("accepted draft", "green"), "  ",
                                           ("resampled after a rejection", "bold red"), "  ",
                                           ("bonus (all K accepted)", "bold blue")))
    table.add_row("", "")
    for name, what in METRICS:
        table.add_row(name, what)
    table.add_row("", "")
    if diagnosis:  # specview.analysis.diagnosis, from this drafter's figures so far
        table.add_row(Text("why", style="bold"), Text("the speedup is what it is (figures so far)", style="bold"))
        for line in diagnosis:
            table.add_row("-", line)
    else:
        table.add_row("why", Text("after a few steps: why the speedup is what it is", style="dim"))
    return table


class HelpScreen(ScrollModal):
    BINDINGS = [Binding("escape,question_mark,q", "dismiss", "Close")]
    DEFAULT_CSS = "HelpScreen > VerticalScroll { width: 90; }"
    box_title = "specview keys"

    def __init__(self, diagnosis: list[str] | None = None):
        super().__init__()
        self.diagnosis = diagnosis or []

    def body(self) -> Table:
        return help_text(self.diagnosis)
