"""Timing, memory and profile files. Never imports textual."""
