"""Hypothesis profiles of the generated-input tier.

``HYPOTHESIS_PROFILE=fuzz`` (``make fuzz``) runs thousands of cases instead of a few hundred.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = settings(
    derandomize=True,  # a fixed seed: every run generates the same cases
    database=None,
    deadline=None,  # one case is a broker and database round trip
    print_blob=False,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # the rig is shared across examples on purpose
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.filter_too_much,
    ],
)
settings.register_profile("generated", _COMMON)
settings.register_profile("fuzz", _COMMON)

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "generated")
FUZZ = PROFILE == "fuzz"


def examples(normal: int, fuzz: int) -> int:
    """How many cases a property runs under the active profile."""
    return fuzz if FUZZ else normal
