"""The commands about a cluster allocation: `app submit` (a Slurm job), `app doctor` (is it ready to train)
and `app rendezvous` (Gloo's rendezvous for ranks that plain srun starts)."""

from __future__ import annotations

import json
import os
import sys

import click

from app.cli.base import ACCEPT_GRPC_HELP, ENGINE_OPTION, NP_OPTION, THREADS_OPTION, Int, cli, relaunch
from app.core.errors import UsageError


@cli.command()
@click.option(
    "--megabytes",
    type=Int(min=1),
    default=100,
    show_default=True,
    help="Allreduce buffer size in MiB (100 is about ResNet-50's float32 gradients); at most 8192.",
)
@click.option("--iterations", type=Int(min=1), default=10, show_default=True, help="Timed allreduces.")
@THREADS_OPTION
@NP_OPTION
@ENGINE_OPTION
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output (rank 0).")
@click.option("--accept-unauthenticated-grpc", "accept_grpc", is_flag=True, help=ACCEPT_GRPC_HELP)
def doctor(megabytes, iterations, threads, np_, engine, as_json, accept_grpc):
    """Check that this allocation is ready to train: build, GPUs, ranks, a timed allreduce, NCCL's network.

    Run it as training runs: inside a job (`srun app doctor`, or `app submit --smoke`), or locally with --np.
    Exits 1 naming the first problem.

    \b
    Example:
      app doctor --np 2 --megabytes 10
      srun --mpi=cray_shasta singularity exec scaleout.sif app doctor    # as LUMI's jobs launch it
      app submit --cluster roihu --gpus 4 --smoke --account project_2001234    # a job does it for you
    """
    if accept_grpc and np_:
        click.echo(
            "Note: --accept-unauthenticated-grpc changes nothing with --np: one host, where neither engine "
            "opens a TensorFlow gRPC server (docs/engines.md)",
            err=True,
        )
    if megabytes > 8192:
        raise UsageError(f"--megabytes {megabytes}: at most 8192 (one allreduce buffer in memory per rank)")
    relaunch(np_, engine=engine or "auto")
    from app.engines.diagnostics import doctor as doctor_stage

    report = doctor_stage.run(megabytes, iterations, threads, engine or "auto", accept_grpc)
    failed = any(not c["ok"] for c in report["checks"])  # the same on every rank: the checks are gathered
    if report["rank"] == 0 and not report.get("stopped"):  # its node's input capacity: a warning at most
        from app.training.benchmark import input_check

        local_size, launcher = report.get("local_size", 1), report.get("launcher", "")
        report["checks"].append(
            doctor_stage.guarded_input_check(
                report, lambda: input_check(threads, os.environ, local_size, launcher)
            )
        )
    if report["rank"] == 0:  # rank 0 speaks for every rank
        if as_json:
            click.echo(json.dumps(report, indent=2, sort_keys=True))
        else:
            from rich.console import Console

            doctor_stage.render(report, Console(width=None if sys.stdout.isatty() else 120))
        sys.stdout.flush()
    if not report.get("stopped"):  # a stopped rank waits for nobody: the others may be stopped too
        doctor_stage.finish(failed)
    if report["rank"] != 0:
        sys.exit(1 if failed else 0)
    doctor_stage.verdict(report)


@cli.command()
@click.option("--gpus", type=Int(), required=True, help="Total GPUs (one worker each).")
@click.option(
    "--cluster",
    required=True,
    help="A profile in jobs/clusters/ (roihu, lumi, roihu-module, lumi-module; tests: local, local-gloo, "
    "local-tf, local-mpich, local-2node, local-2node-gloo, local-2node-tf).",
)
@click.option(
    "-c", "--config", "configs", multiple=True, metavar="FILE", help="Experiment YAML (repeatable)."
)
@click.option(
    "--set", "sets", multiple=True, metavar="KEY=VALUE", help="Config override passed to app train."
)
@click.option(
    "--time",
    "time_limit",
    help="Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS (default: the profile's).",
)
@click.option("--account", help="Slurm account / project (required on CSC and LUMI systems).")
@click.option("--partition", help="Partition (default: the first in the profile that fits).")
@click.option("--image", help="Container image (default: the profile's).")
@click.option("--data-dir", help="Dataset folder for data.data_dir.")
@click.option(
    "--stage",
    "stage_gb",
    type=Int(),
    default=None,
    help="Copy --data-dir to node-local disk first (GB to request, >= 1).",
)
@click.option(
    "--resume",
    "resume",
    metavar="RUN_DIR",
    help="Continue this run directory (its saved config and latest checkpoint) in a new job.",
)
@click.option("--name", help="Job name (default: the config's name).")
@click.option(
    "--max-requeues",
    type=Int(min=0),
    default=20,
    show_default=True,
    help="Requeues of the job at its time limit at most (each needs a new checkpoint since its start).",
)
@click.option(
    "--smoke",
    is_flag=True,
    help="Run `app doctor` in the same job shape instead of training (no -c; 10 min; a test partition).",
)
@click.option("--accept-unauthenticated-grpc", "accept_grpc", is_flag=True, help=ACCEPT_GRPC_HELP)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the rendered script, then (on stderr) its cost at the time limit; submit nothing.",
)
@click.option("--test-only", is_flag=True, help="Ask sbatch --test-only whether and when it would run.")
def submit(
    gpus,
    cluster,
    configs,
    sets,
    time_limit,
    account,
    partition,
    image,
    data_dir,
    stage_gb,
    resume,
    name,
    max_requeues,
    smoke,
    accept_grpc,
    dry_run,
    test_only,
):
    """Submit a training job for N GPUs to a Slurm cluster (one task per GPU; per node under the tf engine).

    Near its time limit the job checkpoints and requeues itself; a run that stopped for good (cancelled,
    failed, out of requeues) continues in a new job with --resume RUN_DIR. On a new cluster, first submit
    --smoke: the same nodes, tasks, container, environment and launch running `app doctor`.

    \b
    Example:
      app submit --cluster roihu --gpus 32 -c configs/resnet50_imagenet.yaml --account project_2001234 \\
                 --data-dir /scratch/project_2001234/imagenet --time 12:00:00
      app submit --cluster lumi --gpus 8 -c configs/synthetic.yaml --account project_465000001 --dry-run
      app submit --cluster roihu --gpus 32 --account project_2001234 --resume runs/resnet50_imagenet-4242
      app submit --cluster lumi --gpus 16 --account project_465000001 --smoke
    """
    from app.cluster import jobscript, profiles
    from app.cluster import submit as submit_stage

    profile = profiles.load_cluster(cluster)
    job = jobscript.render(
        jobscript.JobRequest(
            profile,
            gpus,
            list(configs),
            list(sets),
            time_limit,
            account,
            partition,
            image,
            data_dir,
            stage_gb,
            name,
            resume=resume,
            smoke=smoke,
            max_requeues=max_requeues,
            accept_grpc=accept_grpc,
        )
    )
    notes = [profiles.access_note(profile, job.partition)]
    notes.append(jobscript.unused_consent(profile, job.nodes) if accept_grpc else None)
    for note in filter(None, notes):
        click.echo(f"Note: {note}", err=True)
    if dry_run:  # exactly the script sbatch would get (click.echo would strip escape sequences off a pipe)
        from app.cluster import billing

        sys.stdout.write(job.script)
        sys.stdout.flush()
        # on stderr, as the notes: stdout stays the script alone
        charge = billing.Charge(job.job_name, job.gpus, job.nodes, job.partition, job.time_s)
        click.echo(billing.job_cost(profile, charge), err=True)
        return
    _check_inputs(job, data_dir, configs, sets, resume, smoke)
    answer = submit_stage.sbatch(job, test_only)
    if test_only:
        click.echo(answer)
        return
    click.echo(f"submitted job {answer}: {job.nodes} node(s), {gpus} GPUs, partition {job.partition}")
    click.echo(f"  log:     {job.log_dir}/{job.job_name}-{answer}.out")
    if job.command == "train":
        click.echo(f"  run dir: {job.run_dir or f'{job.runs_dir}/{job.job_name}-{answer}'}")


def _check_inputs(job, data_dir, configs, sets, resume, smoke) -> None:
    """Before sbatch: the image file and the dataset the job will read are there (app.cluster.checks)."""
    from app.cluster.checks import check_inputs
    from app.core import config

    source = None
    if not smoke and resume is None:
        cfg = config.build(list(configs), list(sets), {"data.data_dir": data_dir} if data_dir else {})
        source, data_dir = cfg.data.source, cfg.data.data_dir
    check_inputs(job.image, data_dir, source)


@cli.command()
@click.option(
    "--hosts", required=True, metavar="NODE,...", help="The job's nodes, in Slurm's node-list order."
)
@click.option(
    "--tasks-per-node",
    "spec",
    required=True,
    metavar="COUNTS",
    help="Slurm's SLURM_TASKS_PER_NODE for those nodes, e.g. 4 or 2(x3),1.",
)
def rendezvous(hosts, spec):
    """Serve Horovod's Gloo rendezvous for ranks that plain srun starts (a profile's mpi: none).

    Prints its port and the address the ranks should use ("PORT ADDRESS"), then serves until every rank is
    through Gloo's rendezvous (seconds) or until stopped (SIGTERM). It admits only the job's nodes, and from
    its own node only processes of its user. The job script of `app submit` runs it in the background on the
    job's first node, with a fresh secret in SCALEOUT_RENDEZVOUS_TOKEN (32-128 lowercase hex digits, in the
    environment of the server and of every rank); each rank joins in `hvd.init()` with
    HOROVOD_GLOO_RENDEZVOUS_ADDR and HOROVOD_GLOO_RENDEZVOUS_PORT set to what it printed, and
    HOROVOD_CONTROLLER=gloo (see app/engines/launch/rendezvous.py).

    \b
    Example:
      # inside a Slurm job
      export SCALEOUT_RENDEZVOUS_TOKEN=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
      app rendezvous --hosts "$(scontrol show hostnames "$SLURM_JOB_NODELIST" | paste -sd, -)" \\
                     --tasks-per-node "$SLURM_TASKS_PER_NODE" > rendezvous.txt &
      read -r port addr < rendezvous.txt   # once the file is not empty
    """
    from app.engines.launch import rendezvous as rendezvous_stage

    rendezvous_stage.serve(hosts.split(","), spec)
