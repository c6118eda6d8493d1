"""The advisor: which wall does a model + hardware + workload hit, and which technique pays off.

Torch-free except `local_profile` (measures this machine) and `validate` (runs the engine).
Every number it prints comes with its formula (`calc.Step`), so a reader can check the arithmetic.
"""
