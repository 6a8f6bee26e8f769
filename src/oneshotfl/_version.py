"""The package version, importable without loading anything else."""

__version__ = "0.2.0"
