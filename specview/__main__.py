"""`python -m specview`: the same as the `specview` command."""

from specview.cli.main import entry

entry()
