"""`specview eval`: a prompt set through autoregressive decoding and each drafter, per category
(docs/design/bench-and-eval.md "Eval"). prompts.py reads the sets, command.py runs them, summary.py computes the metrics
(definitions in specview/core/metrics.py), tables.py and plots.py show them."""
