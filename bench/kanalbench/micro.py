"""What the micro-benchmarks (``bench/*_micro.py``) share."""

from __future__ import annotations

import time
from collections.abc import Callable


def rate(case: Callable[[], object], seconds: float) -> float:
    """Microseconds of CPU per call of ``case`` over about ``seconds`` of CPU (calls in batches of
    1,000, so the clock is read rarely)."""
    n = 0
    batch = 1000
    start = time.process_time()
    while True:
        for _ in range(batch):
            case()
        n += batch
        elapsed = time.process_time() - start
        if elapsed >= seconds:
            return elapsed / n * 1e6
