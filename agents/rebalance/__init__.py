"""The rebalancer's pure planning core: which running pods to move, and which to remove on a
scale-down, so that the cluster's capacity stays usable.

Data flows one way: a `ClusterView` is built from Node records and the bound Pod records
(`view`); the `evictor` says which pods may be disturbed at all (the descheduler's
DefaultEvictor protections); the planners read the view and return plans:
`fragmentation` (Koordinator's FragmentationAware: moves that even out each node's
per-resource allocation, as a `koordinator` baseline and a cluster-wide `global` planner that
simulates every destination through the real scheduling core) and `binpack` (Koordinator's
ScaleDownBinPack: which replicas go when a workload shrinks, ranked so that whole nodes
drain). `arbitration` holds the limits every move must pass before it runs (per node,
namespace, workload, PodDisruptionBudget, eviction rate). `objective` measures the result
(node std, stranded capacity).

Nothing here reads a clock, Kafka or Kubernetes: time arrives as arguments, and the agents
around it publish the plans as reservations, evictions and deletion costs.
"""
