"""licensectl: the NVIDIA vGPU license lifecycle for Cozystack + KubeVirt tenants.

The packages are layers; each may import only the layers below it (tests/unit/project/test_layering.py):

    cli/          the hoster's commands                      -> app, controllers, kube, core, shell modules
    app.py        one process: wiring, listeners, leadership -> controllers, serve, kube, core, shell modules
    controllers/  the reconcile loops and their runner       -> kube, core, shell modules
    serve/        HTTP: reports, admission webhook, /metrics -> kube, core, shell modules
    kube/         adapters to the apiserver                  -> core, shell modules
    config.py, logs.py, metrics.py   settings, logging, metric definitions -> core
    exposition.py the /metrics text of the snapshot gauges (metrics.py's writer) -> nothing of licensectl
    core/         pure decisions over plain data              -> nothing of licensectl outside core

docs/design.md#code-map draws the same map with each module's job.
"""

__version__ = "0.1.0"
