"""The reconcile loops: observe the caches, ask the core for the desired state, act through the ports.

Pass order. Two loops run the controllers, each pass in this order (app.py `App._replicate`,
`App._roll`), so that each step reads what the one before it just decided:

  replication loop: signing keys (refreshed; the leader creates or rotates them)
                    -> ReplicationController (replicas rendered from the rotation records)
                    -> RotationController (the next record, from what replication wrote)
  rollout loop:     RolloutController (the plan; its WorkerDrainer drives the tenant workers picked)
                    -> RotationController (judges the wave from the plan just made)
                    -> signing-key pruning (leader only: key holders are VMIs, which this loop sees)

The loops never call each other: they read each other's results through `fleet.FleetView` (the
replication and rollout plans, what a VMI's replica holds), and a loop's step wakes the other only
through the cache events its writes cause. `delivery_probe.DeliveryProbe` runs beside them and gates
the rollout's restarts.

May import: core (decisions, ports), kube (the adapters' value types and clients), and the shell
modules config, logs and metrics. Not serve, app or cli: the loops do not know who serves or wires them.
Every controller takes the cluster through the Protocols of core/ports.py; only `fleet` and
`credentials` (read-side views the App builds) name kube's caches and key store.
Concurrency: every loop runs on the App's event loop and is driven by `runner.py`; nothing here blocks.
"""
