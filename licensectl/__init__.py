"""licensectl: the NVIDIA vGPU license lifecycle for Cozystack + KubeVirt tenants.

The packages are layers; each may import only the layers below it (tests/unit/project/test_layering.py).
docs/design.md#code-map is the one map of the packages and each module's job.
"""

__version__ = "0.2.1"
