"""Structured outputs: the constraint backend on llguidance (llg.py), registered with the core's
constraint seam (engine/constraint.py), and the request fields that ask for it (fields.py)."""
