"""What every HTTP front Ridgeline runs shares (the OpenAI server, the router, the disaggregated
front): OpenAI-style error bodies (errors.py), the guard in front of every route (guard.py: keys and
tenants in api_keys.py, browsers in origins.py), the flags that set them (front_limits.py), uvicorn's
h11 protocol with header deadlines and a connection cap (transport.py), and sockets bound up front
with uvicorn on a thread (server.py). Core: it imports no feature and no entry point."""
