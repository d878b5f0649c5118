"""The reconcile loops: observe the caches, ask the core for the desired state, act through the ports.

May import: core (decisions, ports), kube (the adapters' value types and clients), and the shell
modules config, logs and metrics. Not serve, app or cli: the loops do not know who serves or wires them.
Concurrency: every loop runs on the App's event loop and is driven by `runner.py`; nothing here blocks.
"""
