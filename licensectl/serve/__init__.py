"""The HTTP listeners: guest reports, the admission webhook, and /metrics + health.

May import: core (parsing, delivery decisions), kube (the serving certificate) and the shell modules
config, logs and metrics. Not controllers, app or cli: a listener answers from callables the App hands it.
Concurrency: reports and /metrics run on the App's loop; the webhook runs its own thread and loop
(docs/design.md#webhook-thread).
"""
