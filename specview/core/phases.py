"""The phases of a step: names only (no torch), for the timer, profiles, reports and the TUI."""

# The phase names, ONE home (docs/design/profiles.md). The measured phases never overlap within a step;
# `other` is the rest of the step's wall time; the nested ones sit inside draft/verify and sample.
MEASURED_PHASES = ("draft", "verify", "sample", "cache")
PHASES = MEASURED_PHASES + ("other",)
NESTED_PHASES = ("softmax", "layernorm")
FORWARD_PHASES = ("draft", "verify")  # the two models' forwards; layernorm_ms splits over these
PHASE_ROWS = ("draft", "verify", "sample", "softmax", "layernorm", "cache", "other")  # display order, nested under their parent
PHASE_KEYS = PHASES + NESTED_PHASES  # every key of a step's phases_ms
