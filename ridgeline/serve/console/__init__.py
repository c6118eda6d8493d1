"""The web console at `/`: a chat playground, the live view of the engine, and the advisor's calculators.
Plain files in static/ (no build, nothing fetched from elsewhere) and two JSON APIs (live.py,
advise_api.py), added by routes.install; `ridgeline serve --no-console` leaves them out. Light on
purpose: serve/app.py imports paths.py from here for the Guard."""
