"""The pure core: every decision licensectl takes, as functions over plain data.

May import: the standard library, other core modules, and two computation-only libraries
(defusedxml for untrusted guest XML, cryptography for certificate math). Never the shell (kube,
controllers, serve, cli, app, config, metrics, logs), never I/O: the same inputs give the same answer,
so every rule is tested with plain values and reused by the controller and the CLI alike.
`ports.py` holds the Protocols the shell implements, so the seams are owned here, not by the adapters.
"""
