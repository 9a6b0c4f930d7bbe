"""The library's version (read by the package root and written into saved models)."""

__version__ = "0.1.0"
