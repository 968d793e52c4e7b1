"""What a redraw costs: the text panel grows by the new step only and equals a text built from scratch,
span for span; a panel whose inputs did not change is not drawn again; the fast tables draw what rich's
Table draws. No timings here: `make fidelity` measures those."""

import copy
import json
import random
from dataclasses import replace

import pytest
from rich.console import Console
from rich.style import Style
from rich.text import Text
from test_tui import RECORDING, replay_app, settle
from textual.app import App

from specview.core.palette import ORIGIN_STYLES
from specview.tui.grid import Column, Grid, Lines
from specview.tui.render import HIGHLIGHT, SOURCE
from specview.tui.replay import ReplayBackend
from specview.tui.widgets.acceptance import AcceptancePanel
from specview.tui.widgets.block_view import BlockView
from specview.tui.widgets.memory import MemoryPanel
from specview.tui.widgets.status import StatusLine
from specview.tui.widgets.timing import TimingPanel
from specview.tui.widgets.token_text import TokenText


def from_scratch(info, views, highlight) -> Text:
    """The whole text built in one go, as the panel drew it before it drew by steps (the reference)."""
    source = views[highlight].step.source if highlight is not None and views else None
    lo, hi = source if source else (0, 0)
    text, position = Text(), 0
    for piece in info.prompt_pieces or [info.prompt_text]:
        text.append(piece, style=ORIGIN_STYLES["prompt"] + (" " + SOURCE if lo <= position < hi else ""))
        position += 1
    for i, view in enumerate(views):
        for piece, origin in zip(view.step.tokens, view.step.origins()):
            style = ORIGIN_STYLES[origin] + (" " + HIGHLIGHT if highlight == i else "")
            text.append(piece, style=style + (" " + SOURCE if lo <= position < hi else ""))
            position += 1
    return text


def recorded():
    with open(RECORDING) as f:
        backend = ReplayBackend(json.load(f))
    return backend.info, backend.views


def variants(views):
    """The recorded steps, with what the recording lacks: n-gram sources (reaching back into the prompt and
    into earlier steps), autoregressive steps (the "target" origin has no style: highlighting one adds a
    span), an empty piece and a control code (rich drops it: offsets must be read back)."""
    out = []
    for i, v in enumerate(views):
        step = copy.deepcopy(v.step)
        if i % 4 == 1:
            step = replace(step, source=[max(0, 2 * i - 3), 2 * i + 1])
        if i % 5 == 3:
            step = replace(step, drafted=[], q=[], p=[], r=None, accepted=0, rejected_at=None, resampled=None,
                           residual_top=None, bonus=step.emitted[0], emitted=step.emitted[:1], tokens=step.tokens[:1])
        if i == 6:
            step.tokens = ["", "\r"] + step.tokens[2:]
        out.append(replace(v, step=step))
    return out


class OneWidget(App):
    def __init__(self, widget):
        super().__init__()
        self.widget = widget

    def compose(self):
        yield self.widget


def same(a: Text, b: Text) -> bool:
    return a.plain == b.plain and a.spans == b.spans


@pytest.mark.asyncio
async def test_the_text_grows_by_steps_and_equals_one_built_from_scratch():
    info, recorded_views = recorded()
    views = variants(recorded_views)
    assert any(v.step.source for v in views) and any(not v.step.drafted for v in views)
    panel = TokenText()
    async with OneWidget(panel).run_test(size=(100, 30)) as pilot:
        shown = []
        for i, view in enumerate(views):  # live: the newest step highlighted
            shown.append(view)
            panel.show(info, shown, i, True)
            await pilot.pause()
            assert same(panel.text, from_scratch(info, shown, i)), f"after step {i + 1}"
        rng = random.Random(5)
        for highlight in [0, 3, 3, 12, 1, 6, 13, 9, 4] + [rng.randrange(len(views)) for _ in range(20)]:
            panel.show(info, views, highlight, False)  # browsing: only the old and new block restyled
            assert same(panel.text, from_scratch(info, views, highlight)), f"browsing to step {highlight + 1}"
        panel.show(info, views[:3], 2, True)  # a new run: drawn from the prompt again
        assert same(panel.text, from_scratch(info, views[:3], 2))
        panel.show(info, [], None, True)
        assert same(panel.text, from_scratch(info, [], None))


@pytest.mark.asyncio
async def test_the_text_is_appended_to_not_rebuilt():
    info, views = recorded()
    panel = TokenText()
    async with OneWidget(panel).run_test(size=(100, 30)):
        panel.show(info, views[:5], 4, True)
        text, tokens = panel.text, len(panel._tokens)
        panel.show(info, views[:6], 5, True)
        assert panel.text is text  # the same Text, grown
        assert len(panel._tokens) == tokens + len(views[5].step.tokens)


def counting(widget, name: str, calls: dict) -> None:
    method = getattr(widget, name)

    def counted(*args, **kwargs):
        calls[widget] = calls.get(widget, 0) + 1
        return method(*args, **kwargs)

    setattr(widget, name, counted)


@pytest.mark.asyncio
async def test_a_panel_whose_inputs_did_not_change_is_not_drawn_again():
    app = replay_app()
    async with app.run_test(size=(120, 40)) as pilot:
        await settle(app, pilot)
        for _ in range(4):
            await pilot.press("space")
            await settle(app, pilot)
        panels = [app.query_one(cls) for cls in (AcceptancePanel, TimingPanel, MemoryPanel, StatusLine)]
        block, text = app.query_one(BlockView), app.query_one(TokenText)
        calls: dict = {}
        for widget in panels:
            counting(widget, "refresh", calls)
        counting(block, "update", calls)
        counting(text.body, "update", calls)
        app.redraw()  # nothing changed since the last redraw
        app.redraw()
        assert calls == {}
        app.action_change_k(1)  # K of the next step: the status line and the prediction line only
        assert set(calls) == {app.query_one(AcceptancePanel), app.query_one(StatusLine)}
        assert all(n == 1 for n in calls.values())
        calls.clear()
        await pilot.press("space")  # a new step: every panel once, the text once (the status line at each state)
        await settle(app, pilot)
        assert set(calls) == {*panels, block, text.body}, calls
        twice = (StatusLine, TimingPanel)  # a state change each / the subtitle (ui cpu/step) and the table
        assert all(n == 1 for widget, n in calls.items() if not isinstance(widget, twice)), list(calls.items())
        assert calls[app.query_one(TimingPanel)] == 2
        calls.clear()
        await pilot.press("left")  # browsing: the block and the text; the stats are the run's, unchanged
        assert text.body in calls and block in calls and app.query_one(AcceptancePanel) not in calls


def rich_lines(renderable, width: int) -> list[list]:
    console = Console(width=width, color_system="truecolor", file=open("/dev/null", "w"))
    return [[(s.text, s.style) for s in line if s.text] for line in console.render_lines(renderable, pad=True)]


def merged(line: list) -> list:
    """Adjacent segments of the same style as one: rich and the fast table may cut a line differently."""
    out = []
    for text, style in line:
        style = style or Style()  # no style and the null style draw alike
        if out and out[-1][1] == style:
            out[-1] = (out[-1][0] + text, style)
        else:
            out.append((text, style))
    return out


def random_grid(rng: random.Random) -> Grid:
    words = ["a", "ab", "token", "·the", "↵", "12.5", "0.953", "✓ accept", "日本", "", "long-word-here"]
    expand = rng.random() < 0.5
    columns = [Column("pos", style="dim", min_width=rng.choice([None, 5, 10]))]
    columns += [Column(str(i + 1), justify=rng.choice(["left", "right"]), max_width=rng.choice([None, 9]))
                for i in range(rng.randrange(0, 5))]
    if expand:
        columns.append(Column("share", ratio=1))
    grid = Grid(columns, show_header=rng.random() < 0.7, expand=expand)
    for _ in range(rng.randrange(1, 7)):
        grid.add_row(*[Text(rng.choice(words), style=rng.choice(["", "bold", "green", "dim"]))
                       for _ in columns], style=rng.choice(["", "", "dim"]))
    return grid


def test_the_fast_tables_draw_what_rich_draws():
    rng = random.Random(1)
    drawn = 0
    for _ in range(400):
        grid, width = random_grid(rng), rng.randrange(20, 90)
        lines = grid.lines(width)
        if lines is None:
            continue  # left to rich
        drawn += 1
        table_width = width if grid.expand else lines[0].cell_len
        fast = rich_lines(Lines(lines, table_width), width)
        reference = rich_lines(grid.rich(), width)
        assert [merged(line) for line in fast] == [merged(line) for line in reference]
    assert drawn > 200  # most tables are drawn the fast way


def test_the_block_draws_what_rich_draws():
    """The block's table and verdict side by side, the fast way, against the rich grid it replaced."""
    from rich.padding import Padding
    from rich.table import Table

    from specview.tui.grid import beside
    from specview.tui.widgets.block_view import VERDICT

    _, views = recorded()
    block, fast_ones = BlockView(), 0
    for view in views:
        for greedy, compact, width in [(False, False, 116), (True, False, 116), (False, True, 76), (True, True, 90)]:
            grid = block._table(view, greedy, compact, list(range(len(view.step.drafted))))
            verdict = block._verdict(view, greedy)
            lines = grid.lines(width)
            fast = beside(lines, lines[0].cell_len, verdict, 2, width)
            if fast is None:
                continue  # a verdict line wider than the room: the block draws the rich grid
            fast_ones += 1
            reference = Table.grid(expand=True)
            reference.add_column(no_wrap=True)
            reference.add_column(ratio=1, min_width=VERDICT)
            reference.add_row(grid.rich(), Padding(verdict, (0, 0, 0, 2)))
            assert [merged(line) for line in rich_lines(fast, width)] == \
                   [merged(line) for line in rich_lines(reference, width)]
    assert fast_ones >= 3 * len(views)


@pytest.mark.asyncio
async def test_a_text_that_outgrows_the_panel_still_scrolls_to_its_end():
    """The text fills the panel (no layout while it grows inside it); past it, it grows and scrolls."""
    info, views = recorded()
    panel = TokenText()
    async with OneWidget(panel).run_test(size=(40, 8)) as pilot:
        panel.show(info, views[:1], 0, True)
        await pilot.pause()
        assert panel.max_scroll_y == 0 and panel.body.size.height == panel.scrollable_content_region.height
        for i in range(2, len(views) + 1):
            panel.show(info, views[:i], i - 1, True)
            await pilot.pause()
        await pilot.pause()
        assert panel.max_scroll_y > 0 and panel.scroll_y == panel.max_scroll_y  # live: the newest step in view
        panel.show(info, views, 0, False)  # browsing back to the first step brings it into view
        await pilot.pause()
        await pilot.pause()
        assert panel.scroll_y == 0
