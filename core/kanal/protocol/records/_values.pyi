from collections.abc import Callable
from typing import Any

def record_values(
    b: bytes,
    p: int,
    count: int,
    end: int,
    loads: Callable[[bytes], Any],
    error: type[BaseException],
    fallback: Callable[[bytes], Any],
) -> list[Any]: ...
