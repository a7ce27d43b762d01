"""The package version, at the bottom layer so that every module may read it."""

__version__ = "0.1.0"
