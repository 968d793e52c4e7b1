"""`specview serve`: the engine behind HTTP (docs/design/serve.md), and the client `specview --attach`
watches it with. The server never imports textual."""
