"""Trio I/O: listeners, client connections, upstream channels, the gateway's own Kafka client and state logs."""
