"""Safeguard policies and traffic control: interceptors that protect a shared cluster from bad
clients (topic creation rules, produce and fetch rules, read-only topics, rate and request limits),
built on the public plugin API only. ``plugin.py`` lists the interceptor types; ``rules.py`` holds
the config shapes every policy shares and ``decisions.py`` what a violation becomes.
"""
