"""Serving: the engine loop that runs every request of one model (ds4d.serving.loop), the
pieces of one generation (prompt preparation, the slot's sync, decoding, the tool-call
constraint) and the narrow surface the daemon uses (ds4d.serving.model.ModelServer)."""
