"""`specview serve`: the engine behind HTTP (docs/design.md, "Serve"), and the client `specview --attach`
watches it with. The server never imports textual."""
