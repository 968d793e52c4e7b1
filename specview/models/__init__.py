"""MODEL specs resolved and loaded, placed on devices, GGUF conversions cached, int4 copies."""
