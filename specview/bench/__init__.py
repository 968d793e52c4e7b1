"""`specview bench`: methods timed side by side (autoregressive, each drafter, peers), one interleaved run."""
