"""Dev and test tooling for a licensectl checkout; never installed with the controller.

devcluster/  a real control plane (etcd, kube-apiserver, kube-controller-manager) built from Go modules,
             the project's CRDs, and simulators for what cannot run here (KubeVirt, guests)
testkit/     what tests and benchmarks share: process launchers, in-memory ports, pollers
demo.py      `python -m licensectl_dev.demo` / `make demo`

May import licensectl (any layer); licensectl never imports this package. The dev venv sees it through a .pth file
written by `make` (Makefile); a wheel or the image does not contain it (tests/unit/project/test_packaging.py).
"""
