"""The one error of the record codec."""

from __future__ import annotations


class CorruptRecordError(ValueError):
    """A batch fails its CRC, cannot be decompressed, or its records do not add up."""
