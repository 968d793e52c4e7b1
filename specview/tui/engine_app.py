"""`specview --attach URL` to a serving engine (llama-server, vLLM): the acceptance panel of the TUI from the
engine's own counters, polled from /metrics every second (the whole server life and the last second), and from
the requests the TUI sends (space: the TUI's prompt and settings, one request; the answer's timings). Engines
export counts, not distributions, and the screen says so: there is no block view of p and q here."""

from __future__ import annotations

import asyncio

from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.widgets import Footer, Static

from specview.core.errors import SpecviewError
from specview.core.events import fmt
from specview.core.stopping import Stop
from specview.remote.watch import NO_P_Q, EngineWatch, Figures

POLL_S = 1.0


def figures_table(rows: list[Figures]) -> Table:
    table = Table(title="acceptance (the engine's counters)", title_justify="left", expand=True)
    for col in ("span", "acceptance", "accepted / drafted", "tokens per step", "tokens/s", "accepted at position 1..K"):
        table.add_column(col, justify="left" if col in ("span", "accepted at position 1..K") else "right")
    for f in rows:
        table.add_row(f.source, fmt(f.acceptance_rate, "{:.1%}"),
                      f"{f.accepted} / {f.drafted}" if f.drafted is not None else "n/a",
                      fmt(f.tokens_per_step, "{:.2f}"), fmt(f.tokens_per_s, "{:.1f}"),
                      _positions(f.per_position))
    return table


def _positions(values: list) -> str:
    """Per position up to the last one that accepted anything (an engine keeps a series for every position it
    could draft, 48 for ngram-simple's default), and how many more it keeps."""
    if not values:
        return "not exported"
    last = max((i for i, v in enumerate(values) if v), default=-1)
    shown = " ".join(fmt(v, "{:.0%}", "-") for v in values[: last + 1]) or "none accepted"
    rest = len(values) - last - 1
    return shown + (f" (+{rest} positions at 0)" if rest and last >= 0 else f" ({len(values)} positions)"
                    if last < 0 else "")


class EngineApp(App):
    BINDINGS = [("space", "request", "send the prompt"), ("q", "quit", "quit")]
    CSS = "#head { height: auto; } #figures { height: auto; } #text { height: 1fr; }"

    def __init__(self, watch: EngineWatch):
        super().__init__()
        self.watch = watch
        self.loaded = self.load_finished = True  # run_tui's contract: nothing loads here, no profile is written
        self.quitting, self.profile_path, self.backend = False, None, _NoBackend(watch)
        self.stop = Stop()  # run_tui's too: a signal or a hung-up terminal sets it on its way out (no step to stop)
        self.polled: tuple[Figures, Figures | None] | None = None
        self.answered: Figures | None = None
        self.status = ""

    def compose(self) -> ComposeResult:
        info = self.watch.endpoint.info
        yield Static(Text.assemble((f"{info.get('kind')} {info.get('version') or ''} · {info.get('model')} · "
                                    f"{info.get('url')}\n", "bold"), (NO_P_Q, "yellow")), id="head")
        yield Static(id="figures")
        yield Static(id="text")
        yield Footer()

    async def on_mount(self) -> None:
        self.title = "specview --attach (serving engine)"
        await self.poll_now()
        self.set_interval(POLL_S, self.poll_now)

    async def poll_now(self) -> None:
        try:
            self.polled = await asyncio.to_thread(self.watch.poll)
        except SpecviewError as err:
            self.status = str(err)
        self.redraw()

    async def action_request(self) -> None:
        self.status = "request sent…"
        self.redraw()
        try:
            self.answered = await asyncio.to_thread(self.watch.request)
            self.status = ""
        except SpecviewError as err:
            self.status = str(err)
        self.redraw()

    def redraw(self) -> None:
        rows = [f for f in (self.polled or (None, None)) if f is not None]
        if self.answered is not None:
            rows.append(self.answered)
        note = "" if self.polled is not None else "no /metrics (llama-server: start it with --metrics); "
        self.query_one("#figures", Static).update(
            figures_table(rows) if rows else Text(note + "space sends the prompt and shows its counts"))
        answer = self.answered.text if self.answered is not None else ""
        early = self.answered.early if self.answered is not None else None
        self.query_one("#text", Static).update(Text.assemble((self.status + "\n", "red") if self.status else "",
                                                            (early + "\n", "yellow") if early else "", note, answer))


class _NoBackend:
    """run_tui closes the backend and asks it for a profile: an engine has none."""

    def __init__(self, watch: EngineWatch):
        self.watch = watch

    def save(self, final: bool) -> None:
        return None

    def close(self) -> None:
        self.watch.endpoint.close()
