"""Drafters: what proposes the K tokens a target verifies (a model, n-gram prompt lookup, an int4 copy, layer skipping)."""
