"""The engine and the profiler are libraries: importing them (and running headless) never loads textual."""

import subprocess
import sys

HEADLESS = ["specview.engine.decoder", "specview.engine.sampling", "specview.models.loader", "specview.core.events", "specview.session",
            "specview.cli.run", "specview.cli.main", "specview.profiling.recorder", "specview.cli.report", "specview.cli.bench",
            "specview.analysis.check", "specview.analysis.diagnosis", "specview.backend.engine_stream", "specview.backend.in_process",
            "specview.cli.serve", "specview.tools.measure_serve", "specview.core.file_schemas", "specview.bench.harness",
            "specview.eval.harness", "specview.serve.server"]


def test_headless_modules_do_not_import_textual():
    code = f"import sys; import {', '.join(HEADLESS)}; print(sorted(m for m in sys.modules if m.startswith('textual')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_import_linter_contract_holds():
    """The static check (pyproject's [tool.importlinter]): not even a lazy import path leads to textual."""
    import os
    import shutil

    exe = shutil.which("lint-imports", path=os.path.dirname(sys.executable))
    assert exe, "import-linter is a dev dependency: make install puts it in .venv"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    # this checkout's specview (not whichever one the editable install points at), and no shared cache
    # that a concurrent run could be writing
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    result = subprocess.run([exe, "--no-cache"], capture_output=True, text=True, cwd=root, env=env)
    assert result.returncode == 0, result.stdout[-2000:]


def test_help_loads_no_torch():
    """`specview [COMMAND] --help` parses before importing a command: no torch, so it is instant."""
    code = ("import sys, contextlib, io\nfrom specview.cli.main import main, SUBCOMMANDS\n"
            "for argv in [[]] + [[c] for c in SUBCOMMANDS]:\n"
            "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
            "        main(argv + ['--help'])\n"
            "print(sorted(m for m in ('torch', 'transformers', 'textual') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_no_product_module_runs_as_a_script():
    """Measurement tools live in specview/tools/ (nothing imports them); a product module is imported, never run with
    `python -m` (the TUI's engine child calls engine_stream.main)."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1] / "specview"
    scripts = [str(p.relative_to(root)) for p in root.rglob("*.py")
               if 'if __name__ == "__main__"' in p.read_text() and p.parent.name != "tools"]
    assert scripts == [], scripts
