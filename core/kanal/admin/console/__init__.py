"""The web console: server-rendered pages for operators on the admin port (``/console``).

:mod:`kanal.admin.console.app` is the frame (login, sessions, CSRF, navigation, rendering) and implements
the plugin API's :class:`~kanal.api.console.ConsolePages`; :mod:`kanal.admin.console.charts` draws charts
as SVG on the server; :mod:`kanal.admin.console.gateway_pages` holds the core's own pages; plugins add
theirs through ``kanal_console_pages``.
"""
