"""Shared pytest configuration for the Python suites."""
import sys  # TEMPORARY: removed once the package is installed

sys.path.insert(0, "/work/main/python")  # TEMPORARY
