"""specview: see and measure speculative decoding.

    core/       settings, options, events, metrics, errors, files: no torch (`specview --help` loads only this)
    engine/     the decoder: a step for any drafter, the accept rule, sampling, token trees, the KV cache
    models/     MODEL specs loaded and placed; the GGUF cache; int4 copies
    drafters/   what proposes the K tokens: a model, n-gram lookup, layer skip, trees over any of them
    cpu/        the optional CPU fast path: forward/ (own decode forwards) and matmul/ (thin kernels, csrc/)
    session.py  what every client does before stepping: settings -> loaded, checked models and a prompt
    profiling/  phase timing, profiles, traces, py-spy, recorded distributions
    analysis/   roofline, diagnosis, what-if replay, cost curves, check
    backend/    what every viewer reads: step views, the engine's child-process stream
    remote/     serving engines reached over HTTP: llama-server and vLLM (their endpoints, their counters)
    bench/ eval/ serve/ tui/   the clients
    cli/        one module per command, dispatched from cli.main.COMMANDS
"""
