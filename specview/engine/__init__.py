"""The decoder: a step for any drafter, the accept rule, sampling, token trees, the KV cache's crop."""
