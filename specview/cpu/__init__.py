"""The optional CPU fast path: the engine's own forwards (forward/) and thin matmul kernels (matmul/)."""
