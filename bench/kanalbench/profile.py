"""Summarize a gateway profile: py-spy ``--format raw`` output, or a cProfile stats file.

    python -m kanalbench.profile gateway.txt [--top 25]     # py-spy raw
    python -m kanalbench.profile gateway.prof               # cProfile (--cprofile)

Each line of the input is ``frame;frame;...;frame COUNT`` (outermost first), a frame being
``function (file:line)``. Self = samples where the function is the innermost frame; total = samples
where it is anywhere on the stack (counted once per stack).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")


def _key(frame: str) -> str:
    """``file:function`` of a frame, the file shortened to what follows site-packages/ or core/."""
    match = _FRAME.match(frame.strip())
    if not match:
        return frame.strip()
    path = match["file"]
    for marker in ("site-packages/", "/core/", "/lib/python3"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return f"{path}:{match['func']}"


def summarize(text: str) -> tuple[int, Counter[str], Counter[str]]:
    total = 0
    own: Counter[str] = Counter()
    inclusive: Counter[str] = Counter()
    for line in text.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        frames = [_key(f) for f in stack.split(";") if f]
        if not frames:
            continue
        total += n
        own[frames[-1]] += n
        for key in set(frames):
            inclusive[key] += n
    return total, own, inclusive


def format_summary(text: str, top: int = 25) -> str:
    total, own, inclusive = summarize(text)
    if not total:
        return "no samples\n"
    lines = [f"{total} samples (the gateway's busy time; idle waits are not sampled)", "", "self time:"]
    lines += [f"  {100 * n / total:5.1f}%  {key}" for key, n in own.most_common(top)]
    lines += ["", "total time (function and its callees):"]
    lines += [f"  {100 * n / total:5.1f}%  {key}" for key, n in inclusive.most_common(top)]
    return "\n".join(lines) + "\n"


def format_pstats(path: Path, top: int = 25) -> str:
    """The top functions of a cProfile stats file, by own time and by cumulative time."""
    import io
    import pstats

    out = io.StringIO()
    stats = pstats.Stats(str(path), stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kanalbench.profile", description=__doc__.split("\n")[0])
    parser.add_argument("file", type=Path)
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args(argv)
    try:
        text = format_pstats(args.file, args.top)
    except (ValueError, EOFError, TypeError):  # not a cProfile file: py-spy raw text
        text = format_summary(args.file.read_text(), args.top)
    sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
