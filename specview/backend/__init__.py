"""The engine as a viewer drives it, below every viewer: the TUI (in its own process, attached to a server,
or replaying a recording), the engine stream (backend/engine_stream.py) and the server (serve/) all speak these types.

    views.py        SessionInfo, RunInfo, StepView; a StepView as a stream record and back
    base.py         Backend: the interface a viewer's worker threads call (load, step, K, drafter, save)
    in_process.py   EngineBackend: the engine in this process (the service runs it, tests drive it)

No textual, no HTTP (an import-linter contract)."""
