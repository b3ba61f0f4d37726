"""Kafka record batches (magic v2) and their compression codecs, sans-I/O.

See ``batch`` for the lazy, byte-exact batch model, ``compression`` for the codecs and ``values`` for
the record walk (values, spans, headers, skipping and writing records without ``Record`` objects).
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
from .values import (
    RecordSpan,
    encode_varint,
    record_headers,
    record_spans,
    record_values,
    record_walker,
    records_area,
    skip_records,
    write_record,
)

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
    "ZSTD",
    "CorruptRecordError",
    "Headers",
    "Record",
    "RecordBatch",
    "RecordSet",
    "RecordSpan",
    "UnsupportedCodecError",
    "compress",
    "decompress",
    "encode_batch",
    "encode_varint",
    "record_headers",
    "record_spans",
    "record_values",
    "record_walker",
    "records_area",
    "skip_records",
    "write_record",
]
