"""Kanal's benchmark harness: gateway vs direct, same client, same run, medians and ratios."""
