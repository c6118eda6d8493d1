"""The console's URL paths, shared with the Guard (which must not import the console's routes)."""
STATIC_PREFIX = "/console/static/"
LIVE_PATH = "/console/api/live"
