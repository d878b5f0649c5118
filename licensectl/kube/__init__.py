"""Adapters to the Kubernetes API: the thin client, watch caches, writers, Events, the Lease, TLS.

May import: core (the model and the ports it implements) and the shell modules config, logs and
metrics. Not controllers, serve, app or cli. Everything that knows a wire format (JSON field layout,
status codes, watch lines) lives here and nowhere else; what leaves this package is core dataclasses.
"""
