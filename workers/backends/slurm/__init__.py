"""The Slurm backend: one attempt = one sbatch job submitted through `submitit` (see docs/slurm.md).

- Slurm job name = `req.name` (`shardctl-<job id>-<attempt>`) and working directory = the attempt's
  folder, so `find(name)` adopts this backend's job after a crash and never someone else's.
- One task per node, which is one torchrun agent: the pickled `NodeLauncher` starts torchrun with the
  rendezvous on the job's first host, in the job's environment (`LaunchRequest.environment`), and
  exits with the failing program's own exit code so `sacct` shows it.
- Status: ONE `sacct` per `poll` for all handles, plus at most one `squeue` (slurmdbd lags).
- Preemption by shardctl (`preempt`): `scancel` (SIGTERM, SIGKILL after KillWait); the job ends and its
  next attempt, once admitted again, is a fresh sbatch that resumes from the job's checkpoint folder.
  Preemption by Slurm's scheduler (`PreemptMode=REQUEUE`) or submitit's signal requeues the same job
  (same id and name), and `poll` reports the requeues (`SlurmObservation.requeues` / `requeue_reasons`).

Modules, each with its contract in its docstring:

- `backend`: `SlurmBackend`, the `Backend` protocol, composed of the parts below;
- `submission`: `build_submission`, the one function that decides what sbatch gets (render = submit);
- `launcher`: `NodeLauncher` and its inputs `NodeLaunch`, what runs on each node;
- `client`: `SlurmClient`, every CLI call, and which failures mean unavailable, transient or refused;
- `accounting`: sacct/squeue arguments, parsing and merging;
- `states`: Slurm states -> `RunState` and failure classes (`observe`, `SlurmObservation`);
- `nodelist`: Slurm's compressed node lists;
- `logs`: the log tail of a failed job.
"""

from workers.backends.slurm.backend import SlurmBackend
from workers.backends.slurm.states import SlurmObservation
from workers.backends.slurm.submission import SlurmSubmission

__all__ = ["SlurmBackend", "SlurmObservation", "SlurmSubmission"]
