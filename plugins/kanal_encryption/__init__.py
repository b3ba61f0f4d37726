"""Field and payload encryption of Kafka records, with envelope encryption through a KMS."""
