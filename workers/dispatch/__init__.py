"""The dispatcher's phases, one module each; `workers.dispatcher.Dispatcher` runs them in a cycle.

- `context`: what every phase reads and keeps (`Context`: sessions, backends, `DispatcherConfig`), the
  cycle's `CycleReport` and the crash-test `failpoint`;
- `lease`: admission's lease, then the preemptions it asks for;
- `submit`: SUBMITTING, find-or-submit outside any transaction, PENDING;
- `preempt`: a preemption with notice, and notice again after a crash;
- `reconcile`: one poll per backend, `service.lifecycle_decide.decide` per job, its changes written;
- `replan`: an out-of-memory end planned again under the measured peak;
- `request`: the one `LaunchRequest` builder and the launch preview of `POST /v1/plans`.
"""
