"""Text as users send it. Any Unicode string is a prompt (NUL, right-to-left marks, emoji, only spaces)
except one that is not text: a lone surrogate. It comes from a "\\ud800" escape in JSON, or from argv
bytes that are not UTF-8 (Python keeps them as U+DC80..U+DCFF), and the Rust tokenizers refuse it with
a TypeError. No torch here: the server and the prompt-file readers check before anything is queued."""

from __future__ import annotations


def text_problem(text: str) -> str | None:
    """Why `text` is not Unicode text, in words a user can act on; None when it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as err:
        code = ord(text[err.start])
        if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: a byte of argv or a file name that is not UTF-8
            return (f"byte 0x{code - 0xDC00:02X} at character {err.start} is not UTF-8 "
                    "(give the text in UTF-8)")
        return f"a lone surrogate U+{code:04X} at character {err.start} is not Unicode text (a broken \\u escape?)"
    return None


def ascii_int(text: str, most_digits: int) -> int | None:
    """'0016' -> 16: a whole number written in ASCII digits with at most `most_digits` significant ones, else None.
    "²" is a digit to str.isdigit() but not to int(), and int() refuses over 4300 digits (leading zeros count):
    both raise ValueError, where a parser of user input wants an answer."""
    if not (text.isascii() and text.isdigit()):
        return None
    digits = text.lstrip("0") or "0"
    return int(digits) if len(digits) <= most_digits else None
