"""Authorization: Kafka ACLs, evaluated by the gateway."""
