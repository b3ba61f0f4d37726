"""Tests of the schema registry proxy plugin (a package, so that its conftest does not shadow tests/conftest.py)."""
