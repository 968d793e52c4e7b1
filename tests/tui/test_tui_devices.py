"""A target spread over several devices (--device-map): the memory panel has a line per device."""

import pytest
from textual.app import App

from specview.core.events import StepResult
from specview.tui.stats import LiveStats
from specview.tui.widgets.memory import MemoryPanel

pytestmark = pytest.mark.asyncio


async def panel_text(stats: LiveStats, device: str) -> str:
    """The memory panel's text for `stats` on `device`, drawn by a real app."""

    class Show(App):
        def compose(self):
            yield MemoryPanel()

    app = Show()
    async with app.run_test(size=(60, 20)):
        panel = app.query_one(MemoryPanel)
        panel.show(stats, device=device)
        return panel.render().plain


async def test_the_memory_panel_lists_every_device():
    stats = LiveStats()
    stats.add(StepResult(step=0, drafted=[], q=[], p=[], r=[], accepted=0, rejected_at=None, resampled=None,
                         residual_top=None, bonus=5, emitted=[5],
                         memory_mb={"rss": 900.0, "device_allocated": 300.0, "device_peak": 310.0,
                                    "devices": {"cuda:0": 300.0, "cuda:1": 420.0, "cpu": None, "disk": None}}))

    text = await panel_text(stats, device="cuda:0")
    assert "cuda:1 420" in text and "cuda:0 300" in text and "cpu in rss" in text and "disk offloaded" in text


async def test_the_memory_panel_shows_the_mps_driver_total_beside_rss():
    """On MPS the driver's total holds the GPU's buffers, which rss does not count (unified memory)."""
    stats = LiveStats()
    stats.add(StepResult(step=0, drafted=[], q=[], p=[], r=[], accepted=0, rejected_at=None, resampled=None,
                         residual_top=None, bonus=5, emitted=[5],
                         memory_mb={"rss": 900.0, "device_allocated": 300.0, "device_reserved": None,
                                    "device_peak": 310.0, "device_driver": 1200.0}))

    text = await panel_text(stats, device="mps")
    assert "mps alloc 300" in text and "driver 1200  (not in rss)" in text
