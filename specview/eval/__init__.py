"""`specview eval`: a prompt set through autoregressive decoding and each drafter, per category
(docs/design/bench-and-eval.md "Eval"). core/prompt_sets.py reads the sets, harness.py runs them (the
command is cli/eval.py), summary.py computes the metrics
(definitions in specview/core/metrics.py), tables.py and plots.py show them."""
