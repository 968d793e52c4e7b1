"""The drafted block of one step: per position token, id, q(x), p(x), p/q, r and the verdict; beside it
the resampled token and the residual's top candidates, or the bonus token. A step that drafted fewer than K
(a draft-length policy's budget, a p-min cut, no n-gram match) ends in a column saying why: those positions
were not drafted, which is not a rejection."""

from __future__ import annotations

from rich.padding import Padding
from rich.table import Table
from rich.text import Text
from textual.widgets import Static

from specview.backend.views import StepView
from specview.core.palette import ACCEPT_STYLE, ORIGIN_STYLES, REJECT_STYLE
from specview.tui.grid import Column, Grid, beside
from specview.tui.render import fmt, visible
from specview.tui.widgets.panel import unchanged
from specview.tui.widgets.tree_view import tree_text

CELL = 9  # token text cells per position
VERDICT = 32  # cells kept for the verdict beside the table (resampled token, residual top), padding included
ROWS = ("token", "id", "q(x)", "p(x)", "p/q", "r", "")


STOP_STYLE = "yellow"
STOP_WORDS = {"budget": "budget", "p-min": "p-min", "no-proposal": "no match"}


def stop_reason(s) -> str | None:
    """Why a speculative step drafted fewer than K (docs/design/drafters.md), in words; None when it drafted all
    K, or the record predates policies. Positions past that point were not drafted: not rejected."""
    n = len(s.drafted)
    if s.stopped_by is None or n >= s.k or (s.stop_reason == "eos" and s.rejected_at is None and s.bonus is None):
        return None  # (an EOS among the accepted drafts ended the step there: the rest was never tested)
    if s.stopped_by == "p-min":
        cut = (s.policy or "").partition("=")[2]
        top = f"{s.cut_q:.2f}" if s.cut_q is not None else "its top q"
        return f"p-min: the draft's top q {top} < {cut}" if cut else "p-min cut"
    if s.stopped_by == "no-proposal":
        return "the drafter had nothing more to propose"
    budget = s.budget if s.budget is not None else n
    if s.policy in ("heuristic", "goodput"):
        return f"{s.policy} budget {budget} of K {s.k}"
    return f"budget {budget}: N or the context leave no more room"


def _ratio(p: float, q: float) -> str:
    if q <= 0:
        return "inf"
    v = p / q
    return f"{v:.2f}" if v < 100 else ">99"


class BlockView(Static):
    """One widget, its size fixed by the layout: a new step redraws it without laying the screen out again
    (the table's width changes with the tokens' widths, and a Static of that width would ask for a layout,
    twice, every step)."""

    DEFAULT_CSS = """
    BlockView { border: round $primary-darken-1; height: auto; }
    """

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.border_title = self._title = "block"
        self._subtitle = ""
        self._shown: tuple | None = None  # what the block was last drawn from (panel.unchanged)

    def show(self, view: StepView | None, number: int, total: int, greedy: bool, compact: bool = False) -> None:
        """`compact` (short screens): no position header, no id row. Drawn again only if any of it (or the
        width, which decides the positions that fit) changed."""
        key = (view, number, total, greedy, compact, self.size.width, self.size.height)
        if unchanged(key, self._shown):
            return
        self._shown = key
        if view is None:
            self._titles("block", "")
            self._draw(Text("press space to draft and verify one block", style="dim"), Text(""))
            return
        s = view.step
        title = f"block · step {number}/{total}" if number != total else f"block · step {number}"
        if s.tree:  # a token tree: drawn as one, the verdict beside it
            self._titles(title, f"tree of {len(s.tree['tokens'])} · accepted {s.accepted} · {s.wall_ms:.1f} ms")
            width = (self.size.width or 80) - VERDICT - 4
            self._draw(tree_text(view, greedy, max(width, 24), self.size.height or 8), self._verdict(view, greedy))
            return
        sub = f"K {s.k}" + (f" (drafted {len(s.drafted)})" if len(s.drafted) != s.k else "")
        if s.policy and s.policy != "fixed":
            sub += f" · {s.policy}"
        positions = self._window(s)
        if len(positions) < len(s.drafted):
            sub += f" · positions {positions[0] + 1}-{positions[-1] + 1} of {len(s.drafted)}"
        self._titles(title, f"{sub} · {s.wall_ms:.1f} ms")
        self._draw(self._table(view, greedy, compact, positions), self._verdict(view, greedy))

    def _draw(self, cells: Grid | Text, verdict: Text) -> None:
        """The table at its own width, the verdict beside it (2 cells in) over the rest, at least VERDICT."""
        width = self.size.width
        if isinstance(cells, Grid):
            lines = cells.lines(width)
            drawn = beside(lines, lines[0].cell_len if lines else 0, verdict, 2, width) if lines else None
            if drawn is not None:
                self.update(drawn, layout=not width)  # the size is the layout's (tcss): never the content's
                return
            cells = cells.rich()  # a cell or a line that rich must cut or wrap
        grid = Table.grid(expand=True)
        grid.add_column(no_wrap=True)
        grid.add_column(ratio=1, min_width=VERDICT)
        grid.add_row(cells, Padding(verdict, (0, 0, 0, 2)))
        self.update(grid, layout=not width)

    def _titles(self, title: str, subtitle: str) -> None:
        """Set the border's titles that changed (setting one repaints the widget, changed or not)."""
        if title != self._title:
            self.border_title = self._title = title
        if subtitle != self._subtitle:
            self.border_subtitle = self._subtitle = subtitle

    def on_resize(self) -> None:
        if self._shown:
            self.show(*self._shown[:5])  # the positions that fit depend on the width

    def _window(self, s) -> list[int]:
        """The positions that fit beside the verdict; for a wide block, those up to the rejection."""
        n = len(s.drafted)
        fit = max(1, (self.size.width - VERDICT - 6) // (CELL + 1)) if self.size.width else n
        if stop_reason(s) is not None:
            fit = max(1, fit - 1)  # room for the column that says why drafting stopped
        if n <= fit:
            return list(range(n))
        focus = s.rejected_at if s.rejected_at is not None else n - 1
        start = max(0, min(focus - fit + 2, n - fit))
        return list(range(start, start + fit))

    def _table(self, view: StepView, greedy: bool, compact: bool, positions: list[int]) -> Grid:
        s = view.step
        columns = [Column("pos", style="dim", min_width=10 if greedy else 5)]
        columns += [Column(str(i + 1), justify="right", max_width=CELL) for i in positions]
        why = stop_reason(s)
        n = len(s.drafted)
        if why is not None:  # the positions the step did not draft, and why (not rejected: never drafted)
            columns.append(Column(f"{n + 1}" if s.k == n + 1 else f"{n + 1}-{s.k}", justify="right",
                                  max_width=CELL, style=STOP_STYLE))
        elif not s.drafted:
            columns.append(Column(""))
        table = Grid(columns, show_header=not compact)
        columns = []
        for i in positions:
            tok = s.drafted[i]
            px, qx = s.p[i], s.q[i]
            if i < s.accepted:
                verdict, style = "✓ accept", ACCEPT_STYLE
            elif i == s.rejected_at:
                verdict, style = "✗ reject", REJECT_STYLE
            elif s.stop_reason == "eos" and s.rejected_at is None:
                verdict, style = "cut: eos", "dim"
            else:
                verdict, style = "· unseen", "dim"
            r = "—" if greedy or s.r is None else f"{s.r[i]:.3f}"
            columns.append([
                Text(visible(view.texts.get(tok, "?"), CELL), style=style),
                Text(str(tok), style="dim"),
                Text(f"{qx:.3f}"),
                Text(f"{px:.3f}"),
                Text(_ratio(px, qx), style="bold" if not greedy else ""),
                Text(r),
                Text(verdict, style=style),
            ])
        if why is not None:
            top = f"top {s.cut_q:.2f}" if s.stopped_by == "p-min" and s.cut_q is not None else ""
            columns.append([Text("∅", style=STOP_STYLE), Text(""), Text(top, style=STOP_STYLE), Text(""), Text(""),
                            Text(""), Text(f"∅ {STOP_WORDS.get(s.stopped_by, s.stopped_by)}", style=STOP_STYLE)])
        label = {"r": "r" if not greedy else "r (greedy)", "": ""}
        for row, name in enumerate(ROWS):
            if compact and name == "id":
                continue
            table.add_row(label.get(name, name), *[col[row] for col in columns] or [Text("no drafts", style="dim")])
        return table

    def _verdict(self, view: StepView, greedy: bool) -> Text:
        s, texts = view.step, view.texts
        out = Text()

        def token(tok: int, style: str) -> None:
            out.append(visible(texts.get(tok, "?"), 16), style=style)
            out.append(f"  id {tok}\n", style="dim")

        if s.rejected_at is not None:
            out.append(f"✗ rejected at position {s.rejected_at + 1}\n", style=REJECT_STYLE)
            out.append("resampled ", style="dim")
            token(s.resampled, ORIGIN_STYLES["resampled"])
            what = "target argmax" if greedy else "max(0, p − q), top"
            out.append(f"from {what}:\n", style="dim")
            for tok, prob in (s.residual_top or [])[: 3 if greedy else 5]:
                tok = int(tok)
                out.append(f"  {visible(texts.get(tok, '?'), 12):<12} ", style="bold" if tok == s.resampled else "")
                out.append(f"{prob:6.3f}  ", style="")
                out.append(f"id {tok}\n", style="dim")
        elif s.bonus is not None:
            out.append(f"✓ all {len(s.drafted)} accepted\n" if s.drafted else "no drafts this step\n",
                       style="bold green")
            out.append("bonus ", style="dim")
            token(s.bonus, ORIGIN_STYLES["bonus"])
            out.append(f"from p at position {len(s.drafted) + 1}\n", style="dim")
        why = stop_reason(s)
        if why is not None:
            out.append(f"∅ not drafted from position {len(s.drafted) + 1}: {why}\n", style=STOP_STYLE)
        if s.stop_reason:
            out.append(f"run ended: {s.stop_reason}\n", style="bold magenta")
        out.append(f"emitted {len(s.emitted)} token{'s' if len(s.emitted) != 1 else ''}", style="dim")
        if s.memory_mb.get("rss") is not None:
            out.append(f" · rss {fmt(s.memory_mb['rss'], '{:.0f}')} MB", style="dim")
        return out
