"""Shared pytest configuration for the Python suites.

The suites run against the installed package (``pip install -e .`` or a
wheel): nothing here touches ``sys.path``."""
