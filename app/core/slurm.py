"""What Slurm tells a process about its job, its step and its task.

The one module that reads ``SLURM_*`` variables (as Lightning's ``SLURMEnvironment``); everything else asks a
:class:`SlurmEnv`.

A Slurm batch script is a task too (``SLURM_PROCID`` is set there) but not a step: only ``srun`` sets the
``SLURM_STEP_*`` variables, and a step's own values win over the job's where both exist.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

# The variables by name, for the tables and messages that name them.
PROCID = "SLURM_PROCID"
LOCALID = "SLURM_LOCALID"
NODEID = "SLURM_NODEID"
NTASKS = "SLURM_NTASKS"
STEP_NUM_TASKS = "SLURM_STEP_NUM_TASKS"
CPUS_PER_TASK = "SLURM_CPUS_PER_TASK"
JOB_ID = "SLURM_JOB_ID"
# Slurm's GPU allocation of a step, a job and a node's count (after CUDA/ROCm's masks, app.engines.world).
GPU_VARS = ("SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "SLURM_GPUS_ON_NODE")


def whole(value: str) -> int | None:
    """``value`` as a count (ASCII digits only, at most 9: what launchers and Horovod's strtol agree on)."""
    value = value.strip()
    return int(value) if re.fullmatch(r"[0-9]{1,9}", value) else None


@dataclass(frozen=True)
class SlurmEnv:
    """Typed answers from the ``SLURM_*`` variables of ``env`` (``os.environ`` by default).

    Values that name a variable come as ``(name, value)``: the step's variable when srun set it, else the
    job's, so that a message says which one it read.
    """

    env: Mapping[str, str] = field(default_factory=lambda: os.environ)

    def _pick(self, step_var: str, job_var: str) -> tuple[str, str]:
        var = step_var if self.env.get(step_var) else job_var
        return var, self.env.get(var, "")

    @property
    def job_id(self) -> str | None:
        """The job's id (stable across requeues), or None outside a job."""
        return self.env.get(JOB_ID, "").strip() or None

    @property
    def step_id(self) -> str | None:
        """The srun step's id, or None outside a step."""
        return self.env.get("SLURM_STEP_ID", "").strip() or None

    @property
    def is_task(self) -> bool:
        """Whether this process is a Slurm task: a batch script or a rank of an srun step."""
        return PROCID in self.env

    @property
    def in_step(self) -> bool:
        """Whether srun started this process (a task of a step, however many the step has)."""
        return "SLURM_STEP_ID" in self.env and self.is_task

    @property
    def step_tasks(self) -> int:
        """The tasks of the srun step this process is in; 0 in a batch script (or outside Slurm)."""
        return whole(self.env.get(STEP_NUM_TASKS, "")) or 0

    @property
    def job_tasks(self) -> int | None:
        """What the job asked for (``--ntasks``), or None when it did not say."""
        return whole(self.env.get(NTASKS, ""))

    def task_ids(self) -> dict[str, str]:
        """This task's rank in the step, its index on its node and its node's index, by variable name."""
        return {var: self.env.get(var, "") for var in (PROCID, LOCALID, NODEID)}

    def size(self) -> tuple[str, str]:
        """The step's number of tasks (the job's outside a step)."""
        return self._pick(STEP_NUM_TASKS, NTASKS)

    def tasks_per_node(self) -> tuple[str, str]:
        """The step's tasks per node, in Slurm's compressed form (``2(x3),1``)."""
        return self._pick("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")

    def nodes(self) -> tuple[str, str]:
        """The step's number of nodes (the job's outside a step)."""
        return self._pick("SLURM_STEP_NUM_NODES", "SLURM_NNODES")

    def nodelist(self) -> str:
        """The step's nodes in Slurm's compressed form (the job's outside a step), or ""."""
        return self.env.get("SLURM_STEP_NODELIST") or self.env.get("SLURM_JOB_NODELIST") or ""

    @property
    def node_name(self) -> str:
        """The name slurmd knows this node by, or ""."""
        return self.env.get("SLURMD_NODENAME", "").strip()

    @property
    def cpus_per_task(self) -> str | None:
        """``--cpus-per-task`` as Slurm passed it (unchecked), or None when the job did not ask."""
        return str(self.env[CPUS_PER_TASK]) if CPUS_PER_TASK in self.env else None

    def gpus(self) -> str | None:
        """``VAR=value`` of Slurm's GPU allocation of this process, or None when Slurm gave it none.

        The step's allocation first, then the job's, then the node's count.
        """
        for var in GPU_VARS:
            value = self.env.get(var, "").strip()
            # SLURM_GPUS_ON_NODE is a count; the others list indices.
            if value and not (var == "SLURM_GPUS_ON_NODE" and value == "0"):
                return f"{var}={value}"
        return None

    def says_gpus(self) -> bool:
        """Whether Slurm speaks about this process's GPUs at all: a job, or any of its GPU variables set."""
        return any(v in self.env for v in (JOB_ID, *GPU_VARS))
