"""The Textual TUI: one client of the engine (nothing in engine/, bench/, eval/ or serve/ imports this package)."""
