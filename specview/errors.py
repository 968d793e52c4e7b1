class SpecviewError(Exception):
    """A problem the user can fix: the CLI prints its message as one line and exits 2."""
