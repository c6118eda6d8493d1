"""The console's URL paths, which serve/app.py opens in the Guard (without importing the console's routes)."""
STATIC_PREFIX = "/console/static/"
LIVE_PATH = "/console/api/live"
