"""Kafka record batches (magic v2) and their compression codecs, sans-I/O.

See ``batch`` for the lazy, byte-exact batch model, ``compression`` for the codecs and ``values`` for
the values of a batch's records in one call.
"""

from .batch import (
    CONTROL_ABORT,
    CONTROL_COMMIT,
    CREATE_TIME,
    HEADER_SIZE,
    LOG_APPEND_TIME,
    Headers,
    Record,
    RecordBatch,
    RecordSet,
    encode_batch,
)
from .compression import GZIP, LZ4, NONE, SNAPPY, ZSTD, UnsupportedCodecError, compress, decompress
from .errors import CorruptRecordError
from .values import record_values, records_area
from .varint import ZIGZAG_TABLE, ZIGZAG_TABLE_SIZE, read_zigzag, zigzag_bytes

__all__ = [
    "CONTROL_ABORT",
    "CONTROL_COMMIT",
    "CREATE_TIME",
    "GZIP",
    "HEADER_SIZE",
    "LOG_APPEND_TIME",
    "LZ4",
    "NONE",
    "SNAPPY",
    "ZIGZAG_TABLE",
    "ZIGZAG_TABLE_SIZE",
    "ZSTD",
    "CorruptRecordError",
    "Headers",
    "Record",
    "RecordBatch",
    "RecordSet",
    "UnsupportedCodecError",
    "compress",
    "decompress",
    "encode_batch",
    "read_zigzag",
    "record_values",
    "records_area",
    "zigzag_bytes",
]
