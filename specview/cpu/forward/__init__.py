"""The engine's own decode forwards (Llama, GPT-2), eager or compiled, over a static KV cache."""
