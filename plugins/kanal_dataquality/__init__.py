"""Kanal's first-party data-quality plugin: CEL and JSON schema rules on produced records.

Rule engines (pure, no I/O): ``kanal_dataquality.cel`` (CEL expressions) and
``kanal_dataquality.jsonschema_rule`` (JSON schemas).
"""
