"""The package version (one home: the package root and every front read it here)."""
__version__ = "0.1.0"
