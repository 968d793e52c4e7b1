"""Per-phase timing: the last step and the mean per step, with bars (share of the step's wall time), and
a line per model: its forward (ms) against its memory floor (the roofline, profiling/roofline.py)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from specview.core.events import StepResult
from specview.core.phases import FORWARD_PHASES, PHASE_ROWS
from specview.tui.grid import Column, Grid, Lines
from specview.tui.render import bar, fmt
from specview.tui.stats import LiveStats
from specview.tui.widgets.panel import StatsPanel

NESTED = {"softmax": "in sample", "layernorm": "in forwards"}
COMPACT_ENTRY = 17  # "softmax 9999/9999"
SHORT_NAMES = {"layernorm": "lnorm"}


class TimingPanel(StatsPanel):
    TITLE = "time per step (ms)"
    SUBTITLE = "this step / mean"

    step: StepResult | None = None  # the step on view (its column is "last", or the browsed step)

    def show(self, stats: LiveStats, **extra) -> None:
        cost = stats.ui_cpu_per_step  # what drawing costs the viewer, said where the timings are
        subtitle = self.SUBTITLE + (f" · ui {cost:.1f} ms cpu/step" if cost is not None else "")
        if subtitle != getattr(self, "_subtitle", self.SUBTITLE):  # (setting it repaints, changed or not)
            self.border_subtitle = self._subtitle = subtitle
        super().show(stats, **extra)

    def render(self) -> Lines | Table | Text:
        st, s = self.stats, self.step
        if s is None:
            return Text("no steps yet", style="dim")
        mean_wall = st.mean_wall_ms or 0.0
        base = len(PHASE_ROWS) + 2  # header, phases, wall
        if self.size.height >= base:
            floors = {role: fig for role, fig in st.floors().items() if fig.get("floor_ms") is not None}
            floors = dict(list(floors.items())[: max(0, self.size.height - base)])  # the roofline before the split
            split = bool(s.layernorm_ms) and self.size.height >= base + len(floors) + 2
            return self._table(st, s, mean_wall, split, floors)
        return self._compact(st, s)

    def _table(self, st: LiveStats, s: StepResult, mean_wall: float, split: bool, floors: dict) -> Lines | Table:
        """`split`: layernorm also per model (draft forwards / verify forwards); `floors`: a line per model,
        its mean forward against its memory floor (the roofline)."""
        table = Grid([Column("phase"), Column("step", justify="right"), Column("mean", justify="right"),
                      Column("share", ratio=1)], expand=True)
        bar_width = max(4, self.size.width - 30)
        for name in PHASE_ROWS:
            mean = st.phase_mean(name)
            nested = name in NESTED
            style = "dim" if nested else ""
            share = (mean or 0.0) / mean_wall if mean_wall else None
            table.add_row(Text(("  " if nested else "") + name, style=style), fmt(s.phases_ms.get(name), "{:.1f}"),
                          fmt(mean, "{:.1f}"), bar(share, bar_width, "yellow" if nested else "cyan"))
            if name == "layernorm" and split:
                for model in FORWARD_PHASES:
                    table.add_row(Text(f"    in {model}", style="dim"), fmt(s.layernorm_ms.get(model), "{:.1f}"),
                                  fmt(st.phase_mean(f"layernorm_{model}"), "{:.1f}"), "", style="dim")
        table.add_row(Text("wall", style="bold"), Text(f"{s.wall_ms:.1f}", style="bold"),
                      Text(fmt(st.mean_wall_ms, "{:.1f}"), style="bold"), "")
        for role, fig in floors.items():
            n = len(s.drafted) if role == "draft" else 1
            last = s.phases_ms.get("draft" if role == "draft" else "verify", 0.0) / n if n else None
            table.add_row(Text(f"{role} fwd", style="magenta"), fmt(last, "{:.1f}"), fmt(fig["ms"], "{:.1f}"),
                          Text(f"floor {fig['floor_ms']:.1f} ms · {fmt(fig['share'], '{:.0%}')} of bandwidth",
                               style="magenta"))
        lines = table.lines(self.size.width)
        return Lines(lines, self.size.width) if lines is not None else table.rich()

    def _compact(self, st: LiveStats, s: StepResult) -> Text:
        """Short screens: `phase step/mean` entries in as many columns as fit."""
        entries = [(name, s.phases_ms.get(name), st.phase_mean(name)) for name in PHASE_ROWS]
        entries.append(("wall", s.wall_ms, st.mean_wall_ms))
        columns = max(1, (self.size.width + 1) // (COMPACT_ENTRY + 1))
        rows = -(-len(entries) // columns)
        out = Text()
        for r in range(rows):
            for c, (name, last, mean) in enumerate(entries[r::rows]):
                cell = f"{SHORT_NAMES.get(name, name):<7} {_short(last)}/{_short(mean)}"
                out.append(cell.ljust(COMPACT_ENTRY) + (" " if c < columns - 1 else ""),
                           style="dim" if name in NESTED else "bold" if name == "wall" else "")
            out.append("\n")
        out.rstrip()
        return out


def _short(ms: float | None) -> str:
    return "-" if ms is None else f"{ms:.0f}" if ms >= 100 else f"{ms:.1f}"
