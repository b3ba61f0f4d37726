"""Conformance suite: capture Kafka traffic and replay it through a gateway against a scripted broker.

- :mod:`~kanal.conformance.frames`: the JSONL frame format (read, write, pair requests and responses).
- :mod:`~kanal.conformance.capture`: a gateway frame tap that writes JSONL, with optional redaction.
- :mod:`~kanal.conformance.pcap`: pcap/pcapng import (tcpdump on a broker port) into the same frames.
- :mod:`~kanal.conformance.scripted_broker`: a trio Kafka endpoint that answers from a capture.
- :mod:`~kanal.conformance.replay`: cases, and the runner that replays them through an in-process gateway.
- :mod:`~kanal.conformance.diff`: decoded-message comparison by field path, normalizations and expectations.
- :mod:`~kanal.conformance.cli`: ``kanal capture`` and ``kanal conformance run``.
"""
