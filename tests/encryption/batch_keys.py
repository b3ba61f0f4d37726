"""What the batch tests share: keys over one in-memory KMS, plans compiled from config dicts, and
record batches built with the gateway's codec."""

from __future__ import annotations

from typing import Any

import msgspec
from kanal_encryption.compile import compile_plan
from kanal_encryption.config import EncryptionConfig
from kanal_encryption.crypto.deks import DekManager
from kanal_encryption.crypto.envelope import Envelope, Opener, Sealer
from kanal_encryption.encrypt import Plan
from kanal_encryption.keys import Locator
from kanal_encryption.kms.factory import KmsPool
from kanal_encryption.kms.inline import parse_kms_config
from kanal_encryption.targets import Target

from kanal.api import Record, RecordBatch, encode_batch


class Keys:
    """Encryption and decryption over one in-memory KMS, as the interceptors do it."""

    def __init__(self) -> None:
        self.locator = Locator({}, KmsPool(), None, parse_kms_config({}))
        self.deks = DekManager()

    def sealer_now(self, target: Target, key_id: str, records: int) -> Sealer | None:
        where = self.locator.locate(key_id)
        return self.deks.sealer_now(where.kms, where.key_id, target.algorithm, records, key_ref=where.key_ref)

    async def sealer(self, target: Target, key_id: str, records: int) -> Sealer:
        where = self.locator.locate(key_id)
        return await self.deks.sealer(where.kms, where.key_id, target.algorithm, records, key_ref=where.key_ref)

    def opener_now(self, envelope: Envelope) -> Opener | None:
        kms, key_id = self.locator.find(envelope.key_ref)
        return self.deks.opener_now(kms, key_id, envelope.edek)

    async def opener(self, envelope: Envelope) -> Opener:
        kms, key_id = self.locator.find(envelope.key_ref)
        return await self.deks.opener(kms, key_id, envelope.edek)


def plan_of(keys: Keys, **config: Any) -> Plan:
    return compile_plan(msgspec.convert(config, EncryptionConfig), keys.locator)


def batch_of(records: list[Record]) -> RecordBatch:
    return RecordBatch.from_bytes(encode_batch(records, base_timestamp=1_700_000_000_000))
