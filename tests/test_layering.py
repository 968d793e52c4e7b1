"""The engine and the profiler are libraries: importing them (and running headless) never loads textual."""

import subprocess
import sys

HEADLESS = ["specview.engine", "specview.sampling", "specview.models", "specview.events", "specview.session",
            "specview.runner", "specview.cli", "specview.profiling.recorder", "specview.profiling.report"]


def test_headless_modules_do_not_import_textual():
    code = f"import sys; import {', '.join(HEADLESS)}; print(sorted(m for m in sys.modules if m.startswith('textual')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
