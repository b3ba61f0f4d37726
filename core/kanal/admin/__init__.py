"""The admin plane: HTTP API, resource kinds, the persistent resource store, metrics, audit, CLI.

- :mod:`kanal.api.resources`: resource kinds (what plugins register) and manifests;
- :mod:`kanal.admin.store` and :mod:`kanal.net.state_log`: resources in a compacted topic, followed
  by every gateway node;
- :mod:`kanal.admin.app`: the Quart app (routes, authentication, errors, metrics);
- :mod:`kanal.admin.service`: wiring into the gateway's companion services;
- :mod:`kanal.admin.cli`: ``kanal apply``, ``kanal get``, ``kanal delete``.

Importing this package is cheap (the settings parser uses :mod:`kanal.config.users`); the HTTP stack is
imported only when the admin API is built.
"""
