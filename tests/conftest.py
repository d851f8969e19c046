"""Suite-wide test settings.

Hypothesis: tests check correctness, never timing, so the per-example deadline is off (a 2-core CI machine
running numba compiles and subprocess trainers beside a test would otherwise fail it at random). Under CI
(``CI`` set) examples are derandomized so a red run can be reproduced exactly; locally they stay random so
new inputs keep being explored.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "wanrt",
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("wanrt-ci", parent=settings.get_profile("wanrt"), derandomize=True)
settings.load_profile("wanrt-ci" if os.environ.get("CI") else "wanrt")
