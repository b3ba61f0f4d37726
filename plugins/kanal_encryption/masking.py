"""The ``masking`` interceptor type: irreversible masking of JSON fields on fetch.

For the clients in its scope, the values of the records fetched from matching topics have the
fields each policy names replaced by a masked copy (``MASK_ALL``, ``MASK_FIRST_N``,
``MASK_LAST_N``); what the broker stores is untouched, so other clients (out of the scope) read the
data as it was produced. A config::

    topic: "customers-.*"
    policies:
      - name: cards
        fields: [card.number, "cards[*].number"]
        rule: {type: MASK_FIRST_N, numberOfChars: 12}
      - name: emails
        fields: [user.email]            # MASK_ALL with '*' by default
    errorPolicy: fail_fetch             # or skip_masking

Field paths: ``a.b.c``, ``list[0].x``, and ``[*]`` for every element of a list (``cards[*].number``,
``[*].id`` for a value that is a list). A string is masked character by character; another scalar
as its JSON text (``4111`` -> ``"****"``, the field becomes a string); an object or a list has
each scalar inside it masked (its shape kept); null stays null; a field a record lacks is left
alone.

A value that is not JSON fails the partition's fetch (``fail_fetch``, the default: the client gets
CORRUPT_MESSAGE, see :data:`FAIL_CODE`) or is returned as stored (``skip_masking``, counted).

One pass per batch over the core's record walk: a record is parsed (orjson) only when its topic
matches, written anew (``write_record``) only when a field of it was masked; a batch none of
whose records changed stays the bytes the broker sent. Metrics, in the gateway's registry:

* ``gateway_encryption_records_masked_total{interceptor}``: records with a field masked;
* ``gateway_encryption_masking_skipped_total{interceptor}``: records returned unmasked
  (``skip_masking``: a value that is not JSON);
* ``gateway_encryption_failures_total{interceptor="masking", operation="mask"}``: fetches failed.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from typing import Any, Final

import orjson
from prometheus_client import CollectorRegistry, Counter

from kanal.api import (
    ErrorCode,
    GatewayServices,
    Interceptor,
    InterceptorConfigError,
    PartitionError,
    RecordBatch,
    RecordsContext,
    RecordsResult,
    hookimpl,
    record_spans,
    records_area,
    write_record,
)

from .compile import Topics
from .config import MaskingConfig, MaskingRule
from .paths import PathError
from .runtime import runtime_of

__all__ = ["FAIL_CODE", "MaskingInterceptor", "MaskingMetrics", "mask_text", "parse_mask_path"]

log = logging.getLogger("kanal_encryption")
AUDIT_TYPE = "ENCRYPTION"

#: The error a ``fail_fetch`` partition gets. CORRUPT_MESSAGE says what happened (a record the gateway
#: cannot read as configured) and both client families surface it rather than hide it: the Java
#: consumer throws a KafkaException from ``poll`` ("Encountered corrupt message when fetching offset
#: ..."); librdkafka hands the application a consumer error (code 2, which it names
#: ``KafkaError.INVALID_MSG``, "Broker: Invalid message") and fetches again after its backoff. The
#: partition's position never passes the record, so no unmasked value leaks; the consumer goes on
#: once the record is gone or the policy changes.
FAIL_CODE: Final = int(ErrorCode.corrupt_message)


class _Wildcard:
    """The ``[*]`` step: every element of a list."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "[*]"


WILDCARD: Final = _Wildcard()

Step = str | int | _Wildcard

_NAME = re.compile(r"[^.\[\]]+")
_BRACKET = re.compile(r"\[(\d+|\*)\]")


def parse_mask_path(text: str) -> tuple[Step, ...]:
    """The steps of ``a.b[0].c``, ``cards[*].number`` or ``[*].x``; raises PathError naming what is
    wrong. (As :func:`kanal_encryption.paths.parse_path`, plus ``[*]`` and a leading index for a
    value that is a list.)"""
    steps: list[Step] = []
    pos = 0
    while pos < len(text):
        if text[pos] == "[":
            match = _BRACKET.match(text, pos)
            if match is None:
                raise PathError(f"field path {text!r}: expected [<index>] or [*] at {pos}")
            steps.append(WILDCARD if match.group(1) == "*" else int(match.group(1)))
        else:
            if steps:
                if text[pos] != ".":
                    raise PathError(f"field path {text!r}: unexpected {text[pos]!r} at {pos}")
                pos += 1
            match = _NAME.match(text, pos)
            if match is None:
                raise PathError(f"field path {text!r}: a field name expected at {pos}")
            steps.append(match.group(0))
        pos = match.end()
    if not steps:
        raise PathError(f"field path {text!r}: empty")
    return tuple(steps)


# --------------------------------------------------------------------------- rules


def mask_text(rule: MaskingRule) -> Callable[[str], str]:
    """The function masking a string by ``rule`` (checked)."""
    char, n = rule.masking_char, rule.number_of_chars
    if rule.type == "MASK_FIRST_N":
        return lambda s: char * min(n, len(s)) + s[n:]
    if rule.type == "MASK_LAST_N":
        return lambda s: s[: max(len(s) - n, 0)] + char * min(n, len(s))
    return lambda s: char * len(s)


def _masker(text: Callable[[str], str]) -> Callable[[Any], Any]:
    """The function masking a JSON value: strings by ``text``, other scalars as their JSON text,
    containers scalar by scalar, null kept."""

    def mask(value: Any) -> Any:
        if isinstance(value, str):
            return text(value)
        if value is None:
            return None
        if isinstance(value, dict):
            return {k: mask(v) for k, v in value.items()}
        if isinstance(value, list):
            return [mask(v) for v in value]
        return text(orjson.dumps(value).decode())

    return mask


def _apply(node: Any, steps: tuple[Step, ...], i: int, mask: Callable[[Any], Any]) -> bool:
    """Masks, in place, the field at ``steps[i:]`` of ``node`` (every one, past a wildcard); whether
    any changed."""
    last = len(steps) - 1
    while True:
        step = steps[i]
        if step is WILDCARD:
            if not isinstance(node, list):
                return False
            changed = False
            if i == last:
                for j, child in enumerate(node):
                    new = node[j] = mask(child)
                    changed = changed or new is not child
            else:
                for child in node:
                    changed = _apply(child, steps, i + 1, mask) or changed
            return changed
        if type(step) is int:
            if not isinstance(node, list) or step >= len(node):
                return False
        elif not isinstance(node, dict) or step not in node:
            return False
        if i == last:
            child = node[step]
            new = node[step] = mask(child)
            return new is not child
        node = node[step]
        i += 1


# --------------------------------------------------------------------------- metrics


class MaskingMetrics:
    """The masking counters, once per gateway registry (kept in ``services.shared``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.masked = Counter(
            "gateway_encryption_records_masked", "Records with a field masked on fetch", ["interceptor"], registry=r
        )
        self.skipped = Counter(
            "gateway_encryption_masking_skipped",
            "Records returned unmasked on fetch (skip_masking: a value that is not JSON)",
            ["interceptor"],
            registry=r,
        )


_SHARED_KEY = "kanal_encryption.masking"


def masking_metrics_of(services: GatewayServices) -> MaskingMetrics:
    metrics = services.shared.get(_SHARED_KEY)
    if isinstance(metrics, MaskingMetrics):
        return metrics
    metrics = services.shared[_SHARED_KEY] = MaskingMetrics(services.metrics)
    return metrics


# --------------------------------------------------------------------------- the interceptor


class _Unmaskable(Exception):
    """A value that is not JSON, under ``fail_fetch``."""


Compiled = tuple[tuple[tuple[Step, ...], Callable[[Any], Any]], ...]


def _compile(config: MaskingConfig) -> Compiled:
    """(steps, masker) per field of every policy, in order; InterceptorConfigError names the field."""
    if not config.policies:
        raise InterceptorConfigError("policies: at least one policy is needed")
    compiled: list[tuple[tuple[Step, ...], Callable[[Any], Any]]] = []
    for p, policy in enumerate(config.policies):
        where = f"policies[{p}]"
        rule = policy.rule
        if len(rule.masking_char) != 1:
            raise InterceptorConfigError(
                f"{where}.rule.maskingChar: must be exactly one character, not {rule.masking_char!r}"
            )
        if rule.type != "MASK_ALL" and rule.number_of_chars < 0:
            raise InterceptorConfigError(
                f"{where}.rule.numberOfChars: must be 0 or more for {rule.type}, not {rule.number_of_chars}"
            )
        if not policy.fields:
            raise InterceptorConfigError(f"{where}.fields: at least one field is needed")
        mask = _masker(mask_text(rule))
        for f, text in enumerate(policy.fields):
            try:
                steps = parse_mask_path(text)
            except PathError as exc:
                raise InterceptorConfigError(f"{where}.fields[{f}]: {exc}") from None
            compiled.append((steps, mask))
    return tuple(compiled)


class MaskingInterceptor(Interceptor):
    """Masks JSON fields of the records fetched from matching topics (irreversibly, on fetch only)."""

    plugin_name = "masking"
    description = "Masks JSON fields of record values on fetch (MASK_ALL, MASK_FIRST_N, MASK_LAST_N)"
    config_type = MaskingConfig

    def __init__(self, config: MaskingConfig, services: GatewayServices) -> None:
        super().__init__(config, services)
        self._topics = Topics(config.topic)
        self._fields = _compile(config)
        self._fail = config.error_policy == "fail_fetch"
        self._metrics = masking_metrics_of(services)

    @hookimpl
    def kanal_fetch_records(self, ctx: RecordsContext) -> RecordsResult:
        if not self._topics.matches(ctx.topic):
            return None
        records = ctx.records
        if records.has_legacy and self._fail:  # (message format v0/v1: opaque to the gateway)
            return self._failed(ctx, "message format v0/v1 records cannot be masked")
        masked = skipped = 0
        for batch in list(records.batches):
            if batch.is_control:
                continue
            try:
                data, count, unmasked = self._mask_batch(batch)
            except _Unmaskable as exc:
                return self._failed(ctx, str(exc))
            except ValueError as exc:  # the record walk: a batch that does not add up
                return self._failed(ctx, f"a batch at offset {batch.base_offset} does not parse: {exc}")
            skipped += unmasked
            if data is not None:
                records.replace(batch, data)
                masked += count
        if masked:
            self._metrics.masked.labels(self.plugin_name).inc(masked)
        if skipped:
            self._metrics.skipped.labels(self.plugin_name).inc(skipped)
        return None

    def _mask_batch(self, batch: RecordBatch) -> tuple[bytes | None, int, int]:
        """The batch's bytes with its records masked (None: none had a field to mask), how many
        records were masked, and how many were left unmasked (not JSON, ``skip_masking``)."""
        area, start = records_area(batch)
        count = batch.records_count
        spans = record_spans(area, start, count, len(area))
        view = memoryview(area)
        loads, dumps, error = orjson.loads, orjson.dumps, orjson.JSONDecodeError
        fields = self._fields
        out = bytearray()
        masked = skipped = 0
        for span in spans:
            at = span[8]
            if at < 0:  # a null value (a tombstone): nothing to mask
                out += view[span[0] : span[2]]
                continue
            try:
                document = loads(view[at : span[9]])
            except error:
                if self._fail:
                    raise _Unmaskable(f"the value at offset {batch.base_offset + span[5]} is not JSON") from None
                skipped += 1
                out += view[span[0] : span[2]]
                continue
            changed = False
            for steps, mask in fields:
                if _apply(document, steps, 0, mask):
                    changed = True
            if changed:
                write_record(out, area, span, dumps(document))
                masked += 1
            else:
                out += view[span[0] : span[2]]
        if not masked:
            return None, 0, skipped
        return batch.with_records(out, count), masked, skipped

    def _failed(self, ctx: RecordsContext, reason: str) -> PartitionError:
        runtime_of(self.services).metrics.failures.labels(self.plugin_name, "mask").inc()
        self.services.audit(
            AUDIT_TYPE,
            ctx.connection,
            {"operation": "mask", "topic": ctx.topic, "partition": ctx.partition, "reason": reason},
        )
        log.warning("masking failed for %s-%d: %s", ctx.topic, ctx.partition, reason)
        return PartitionError(FAIL_CODE, f"masking failed: {reason}")
