"""OpenAI-compatible HTTP server: `ridgeline serve`, or `build_app(engine, ServerSettings(...))`."""
