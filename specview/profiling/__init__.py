"""Profiles of a run: norm hooks, op capture, exporters (Chrome trace, speedscope), py-spy, recorded distributions."""
