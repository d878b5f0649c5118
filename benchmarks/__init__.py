"""Scale benchmarks of licensectl against a real kube-apiserver (not pass/fail tests).

`python -m benchmarks [replication|rollout|all] [--scale small|full]` builds a fleet on a local
control plane, runs the controller as its own process and prints one table per benchmark, with
any baseline measured in the same run. See benchmarks/README.md.
"""
