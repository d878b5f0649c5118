"""licensectl: the NVIDIA vGPU license lifecycle for Cozystack + KubeVirt tenants."""

__version__ = "0.1.0"
