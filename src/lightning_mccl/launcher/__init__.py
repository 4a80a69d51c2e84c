"""The launcher as a library: what `mccl launch` and `mccl doctor` (`lightning_mccl.cli`, their front ends)
and the benchmarks run ranks with. Loads neither torch nor Lightning, and nothing outside the standard
library but this package's own torch-free modules.

- Where ranks run: a `LaunchPlan` (`launch_plan`): hosts, command, rendezvous port, each rank's
  environment, the argv that starts its rank shim (`rank_shim`: locally, over ``ssh``, or inside an emulated
  host's network namespace). `fleet_plan` builds one from the commands' options; `local_plan`,
  `switch_plan` and `hostfile_plan` build each kind.
- Running them: `supervise(plan)` (`supervisor`): every rank's output on one stream, the first failure
  stops the others, signals forwarded, deadlines; `run_job(plan)` (`job`) adds restarts and the launcher's
  output stages, in front of `PrefixedOutput`: `RankTails` and `first_error` (`error_line`; a cause the output
  names anywhere, such as macOS's GPU watchdog: `known_causes`), `QuietStop`,
  `SameLines`, `SummaryTap` (`fleet_summary`), `ProgressLines` (`progress`: rank 0's progress bar live on a
  terminal, now and then in a log).
- `mccl doctor`'s parts: `doctor_checks` (the probe and its judgement, with `host_probe`, `host_checks` (every
  check declared), `findings`, `mac_checks`, `host_net`), `doctor_bench` (the measurement ranks run, with
  `doctor_reach`, `doctor_speed` and `doctor_reduction`) and `fleet_checks` (its judgement).
- `free_port()`: a free TCP port, for ``--local`` and for every test and benchmark that needs one.
"""
from .error_line import RankTails, first_error
from .extra_env import parse_env, secret_names_with_values, warn_secret_values
from .fleet_summary import SummaryTap
from .job import JobResult, run_job
from .launch_plan import (DEFAULT_GRACE_S, DEFAULT_SSH, SHIM_BOOTSTRAP, LaunchError, LaunchPlan, fleet_plan, free_port,
                          hostfile_plan, local_plan, resolve_command, switch_plan)
from .prefixed_output import OutputStage, PrefixedOutput
from .progress import ProgressLines
from .quiet_stop import QuietStop, wants_everything
from .rank_process import RankProcess, RankSpec
from .same_lines import SameLines
from .supervisor import Outcome, RankExit, Supervisor, supervise

__all__ = [
    "DEFAULT_GRACE_S", "DEFAULT_SSH", "SHIM_BOOTSTRAP", "JobResult", "LaunchError", "LaunchPlan", "Outcome",
    "OutputStage", "PrefixedOutput", "ProgressLines", "QuietStop", "RankExit", "RankProcess", "RankSpec",
    "RankTails", "SameLines", "SummaryTap", "Supervisor", "first_error", "fleet_plan", "free_port", "hostfile_plan",
    "local_plan", "parse_env", "resolve_command", "run_job", "secret_names_with_values", "supervise", "switch_plan",
    "wants_everything", "warn_secret_values",
]
