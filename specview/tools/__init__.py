"""Tools run with `python -m specview.tools.<name>`: results (docs/benchmarks.md from docs/results/*.json), and the
measurements startup, soak, overhead, pair, random_pair, measure_serve and tui_fidelity. Apart from the product, as
gpt-fast keeps scripts/ apart from generate.py: nothing imports this package (the layers contract in pyproject.toml
puts it on top), and each tool imports what it measures."""
