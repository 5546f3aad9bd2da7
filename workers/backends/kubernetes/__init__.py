"""The Kubernetes backend (see `docs/kubernetes.md`), in five files:

- `naming`: the API types it uses, object names and identity labels;
- `render`: the objects of one attempt, as plain dicts (pure);
- `client`: the API server through `kubernetes.dynamic.DynamicClient`, in the backend error vocabulary;
- `status`: a workload and its pods to an `Observation` (pure);
- `backend`: `KubernetesBackend`, the `Backend` protocol over those.
"""

from workers.backends.kubernetes.backend import KubernetesBackend

__all__ = ["KubernetesBackend"]
