"""The command line: one module per command, dispatched from main.COMMANDS."""
