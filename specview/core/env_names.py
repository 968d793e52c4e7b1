"""Environment variables renamed with the modules they tune: the old names keep working for one release, each with a
one-line warning, and a new name set beside an old one wins."""

from __future__ import annotations

import os
import sys

RENAMED = {  # old name -> new name (rooms: one name per thing)
    "SPECVIEW_FASTLINEAR": "SPECVIEW_PACKED_LINEAR",
    "SPECVIEW_THINMM": "SPECVIEW_THIN_KERNELS",
    "SPECVIEW_THINMM_CFLAGS": "SPECVIEW_THIN_KERNELS_CFLAGS",
}


def adopt_old_names(environ=os.environ, warn=lambda line: print(line, file=sys.stderr)) -> None:
    """Copy each old variable that is set to its new name (unless the new one is set too), saying so once."""
    for old, new in RENAMED.items():
        if old in environ:
            if new not in environ:
                environ[new] = environ[old]
            warn(f"specview: {old} is now {new}; the old name works until the next release")
