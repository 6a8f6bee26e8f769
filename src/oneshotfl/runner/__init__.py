"""Runners: the local simulation (this package) executes any registered method."""
