"""Helpers shared by the test modules."""

from specview.cli.main import main


def run_cli(capsys, *argv):
    """specview's main() in-process -> (exit code, stdout, stderr); argparse errors exit via SystemExit."""
    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err
