"""The Textual TUI: one client of the engine (specview.engine never imports this package)."""
