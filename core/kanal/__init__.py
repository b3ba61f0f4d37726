"""Kanal: an open Kafka gateway."""

__version__ = "0.1.0"
