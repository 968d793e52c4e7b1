"""Memory: process RSS and, where there is a device, allocated and peak (and MPS's driver total); RSS as a sparkline."""

from __future__ import annotations

from rich.text import Text

from specview.tui.render import fmt, sparkline
from specview.tui.widgets.panel import StatsPanel


class MemoryPanel(StatsPanel):
    TITLE = "memory (MB)"
    device = ""

    def render(self) -> Text:
        st = self.stats
        width = max(self.size.width, 10)
        out = Text(no_wrap=True, overflow="ellipsis")
        rss = st.memory_series("rss")
        if not rss:
            out.append("no steps yet", style="dim")
            return out
        out.append("rss  ", style="dim")
        out.append(f"{rss[-1]:.0f}", style="bold")
        out.append(f"  peak {max(rss):.0f}\n", style="dim")
        out.append(sparkline(rss, width) + "\n", style="magenta")
        alloc = st.memory_series("device_allocated")
        if alloc:
            peak = st.memory_series("device_peak")
            out.append(f"{self.device} alloc ", style="dim")
            out.append(f"{alloc[-1]:.0f}", style="bold")
            out.append(f"  peak {fmt(max(peak) if peak else None, '{:.0f}')}\n", style="dim")
            out.append(sparkline(alloc, width) + "\n", style="magenta")
            driver = st.steps[-1].memory_mb.get("device_driver")
            if driver is not None:  # MPS: the Metal driver's total (unified memory: not in rss)
                out.append("driver ", style="dim")
                out.append(f"{driver:.0f}", style="bold")
                out.append("  (not in rss)\n", style="dim")
        else:
            out.append(f"{self.device or 'cpu'}: no device memory\n", style="dim")
        for name, mb in (st.steps[-1].memory_mb.get("devices") or {}).items():  # --device-map: each device
            out.append(f"{name} ", style="dim")
            out.append(f"{mb:.0f}\n" if mb is not None else "in rss\n" if name == "cpu" else "offloaded\n",
                       style="bold" if mb is not None else "dim")
        out.rstrip()
        return out
