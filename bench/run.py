"""Kanal benchmarks: the gateway against the direct path, in the same run, as ratios.

    python bench/run.py passthrough-throughput --size 1024 --records 200000 --repeats 5
    python bench/run.py passthrough-latency --rate 5000 --seconds 10
    python bench/run.py idle-connections --count 1000
    python bench/run.py all --json results.json

The gateway runs from the ``kanal`` package this process imports: the one on PYTHONPATH if any, else
this checkout's ``core/``. See bench/README.md and docs/benchmarks.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
CORE = BENCH.parent / "core"


def main() -> int:
    sys.path.insert(0, str(BENCH))
    try:  # a kanal on PYTHONPATH (a snapshot of core/, an installed one) wins over this checkout's
        import kanal  # noqa: F401
    except ImportError:
        sys.path.insert(1, str(CORE))
    from kanalbench.cli import main as cli_main

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
