class SpecviewError(Exception):
    """A problem the user can fix: the CLI prints its message as one line and exits 2."""


def quoted(text: str, most: int = 60) -> str:
    """A user's text inside a one-line error message: repr'd, and cut short (a 5000-digit number stays a line)."""
    return repr(text) if len(text) <= most else repr(text[:most]) + f"... ({len(text)} characters)"


def shown(text: str, most: int = 120) -> str:
    """A user's text inside a message as it is, but on one line (control characters escaped) and cut short."""
    if not text.isprintable():
        text = repr(text)[1:-1]
    return text if len(text) <= most else text[:most] + f"... ({len(text)} characters)"


def one_line(err: Exception, limit: int = 240) -> str:
    """An exception's message on one line: transformers' messages often end their first line with ':'
    and put the substance on the next ones."""
    text = " ".join(line.strip() for line in str(err).strip().splitlines() if line.strip())
    text = text or type(err).__name__
    return text if len(text) <= limit else text[: limit - 1] + "…"
