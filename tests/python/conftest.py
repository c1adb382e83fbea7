"""Shared pytest configuration for the Python suites.

The suites run against the installed package (``pip install -e .`` or a
wheel): nothing here touches ``sys.path``.

Hypothesis runs under one of two profiles, chosen by the environment
variable ``KVSELECT_HYPOTHESIS``:

- ``ci`` (the default): derandomized, so a failure reproduces on the next
  run, with the health checks that flag slow data generation suppressed
  (the strategies build arrays on purpose);
- ``explore``: random seeds and every health check on, to look for new
  failures; run it before closing a change
  (``KVSELECT_HYPOTHESIS=explore python -m pytest -q tests/python``).

Each test sets only its own ``max_examples`` and ``deadline``.
"""

import os

from hypothesis import HealthCheck, settings

settings.register_profile("ci", derandomize=True, suppress_health_check=list(HealthCheck), database=None)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("KVSELECT_HYPOTHESIS", "ci"))
