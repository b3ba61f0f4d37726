"""Gateway configuration: environment variables, an optional YAML file, validation."""
