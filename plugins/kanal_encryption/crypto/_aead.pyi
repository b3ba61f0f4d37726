from collections.abc import Sequence
from types import EllipsisType

Buffer = bytes | bytearray | memoryview

class Aead:
    def __init__(self, algorithm: int, key: Buffer, nonce_start: bytes, error: type[Exception]) -> None: ...
    def encrypt(self, nonce: Buffer, data: Buffer, aad: Buffer) -> bytes: ...
    def decrypt(self, nonce: Buffer, data: Buffer, aad: Buffer) -> bytes: ...
    def seal(self, header: Buffer, plaintext: Buffer, aad: Buffer) -> bytes: ...
    def seal_text(self, header: Buffer, plaintext: Buffer, aad: Buffer) -> str: ...
    @property
    def count(self) -> int: ...

Field = tuple[tuple[str | int, ...], Aead, bytes, bytes]

def seal_json_fields(
    area: bytes, spans: Sequence[tuple[int, ...]], fields: tuple[Field, ...]
) -> list[bytes | EllipsisType | None]: ...
def open_json_fields(
    area: bytes,
    spans: Sequence[tuple[int, ...]],
    start: int,
    heads: dict[bytes, Aead],
    prefix: bytes,
    part: bytes,
    fields: tuple[tuple[str | int, ...], ...] | None,
    keys: bool,
    headers: bool,
) -> tuple[list[bytes | None], int]: ...
