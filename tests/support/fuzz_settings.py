"""How hard the fuzz tests search. `make test` runs the short form: seeded (derandomized), a fixed number of
examples, no deadline, so it finds the same things on every machine and run. `make fuzz` sets
SPECVIEW_FUZZ=long: random seeds, many more examples, each test stopped after SPECVIEW_FUZZ_SECONDS even if it
has examples left. No example database: several tests build their strategies from fixtures (temp paths, a
server's schema) that differ from run to run, so a saved example would not replay; a failure prints the
@reproduce_failure blob instead."""

from __future__ import annotations

import os
import time

from hypothesis import HealthCheck, Phase, settings

LONG = os.environ.get("SPECVIEW_FUZZ") == "long"
SECONDS = float(os.environ.get("SPECVIEW_FUZZ_SECONDS", "120"))  # per test, long form only


def fuzz(short: int, long: int | None = None) -> settings:
    """Settings for a property test: `short` examples in make test, `long` (default 20x) in make fuzz."""
    if LONG:
        return settings(max_examples=long or 20 * short, deadline=None, suppress_health_check=list(HealthCheck),
                        database=None, phases=[Phase.explicit, Phase.generate, Phase.shrink],
                        print_blob=True)
    return settings(max_examples=short, deadline=None, derandomize=True, database=None,
                    suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])


class Budget:
    """The long form's time bound: examples past it pass at once (hypothesis has no wall-clock limit)."""

    def __init__(self):
        self.stop_at = time.monotonic() + SECONDS if LONG else None

    def spent(self) -> bool:
        return self.stop_at is not None and time.monotonic() > self.stop_at
