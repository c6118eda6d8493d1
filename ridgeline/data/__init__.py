"""Data the core ships: the public-domain texts that calibration reads and evaluation scores."""
