"""Draft models derived from a target (cheaper copies of the same weights)."""
