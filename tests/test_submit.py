"""`app submit`: golden scripts per cluster profile, every error, and no shell injection."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from app import submit
from app.cli import cli
from app.errors import UsageError

GOLDEN = Path(__file__).parent / "golden"
CLUSTERS = ["lumi", "mahti", "puhti", "roihu", "local"]


def render(cluster: str, gpus: int, **kw):
    kw.setdefault("account", None if cluster == "local" else "project_2001234")
    kw.setdefault("data_dir", None)
    return submit.render(
        submit.load_cluster(cluster), gpus, ["configs/synthetic.yaml"], python="/opt/venv/bin/python", **kw
    )


def cases():
    for cluster in CLUSTERS:
        gpn = submit.load_cluster(cluster).gpus_per_node
        for gpus in sorted({1, gpn, 32}):
            yield cluster, gpus


# 32 GPUs cannot be had on every system: the golden answer there is the error.
IMPOSSIBLE = {
    (
        "mahti",
        32,
    ): "--gpus 32 needs 8 nodes; the largest partition on mahti (gpumedium) allows at most 6 (24 GPUs)",
    ("local", 32): "--gpus 32 needs 16 nodes; partition debug on local allows at most 1 (2 GPUs)",
}


@pytest.mark.parametrize("cluster, gpus", list(cases()))
def test_golden_scripts(cluster, gpus):
    if (cluster, gpus) in IMPOSSIBLE:
        with pytest.raises(UsageError) as err:
            render(cluster, gpus)
        assert str(err.value) == IMPOSSIBLE[(cluster, gpus)]
        return
    script = render(cluster, gpus).script
    path = GOLDEN / f"{cluster}-{gpus}gpu.sbatch"
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(script)
    assert script == path.read_text(), (
        f"regenerate with UPDATE_GOLDEN=1 pytest {__file__} and review the diff"
    )


def test_golden_scripts_are_valid_bash():
    for path in GOLDEN.glob("*.sbatch"):
        subprocess.run(["bash", "-n", str(path)], check=True)


def test_shape_of_a_multi_node_job():
    job = render("puhti", 32)
    assert (job.nodes, job.partition) == (8, "gpu")
    for line in ("#SBATCH --nodes=8", "#SBATCH --ntasks-per-node=4", "#SBATCH --gres=gpu:v100:4", "#SBATCH --cpus-per-task=10",
                 "#SBATCH --output=logs/%x-%j.out", "#SBATCH --signal=USR1@600", "#SBATCH --requeue",
                 "srun --kill-on-bad-exit=1 --mpi=pmix", "apptainer exec --nv"):  # fmt: skip
        assert line in job.script
    assert 'if [ "$status" -eq 3 ]; then' in job.script  # the documented requeue exit code


def test_partition_choice_and_staging():
    assert render("mahti", 2).partition == "gpusmall"
    assert render("mahti", 4).partition == "gpumedium"  # gpusmall takes at most 2 GPUs
    assert render("mahti", 4, partition="gputest", time_limit="00:10:00").partition == "gputest"
    staged = render("mahti", 8, data_dir="/scratch/p/imagenet", stage_gb=300).script
    assert (
        "#SBATCH --gres=gpu:a100:4,nvme:300" in staged and 'cp -r -- "$DATA_DIR" "$LOCAL_SCRATCH/"' in staged
    )
    lumi = render("lumi", 16).script
    assert "#SBATCH --gpus-per-node=8" in lumi and "singularity exec --rocm" in lumi


@pytest.mark.parametrize(
    "kw, message",
    [
        (
            dict(cluster="mahti", gpus=30),
            "--gpus 30 is not a multiple of 4 GPUs per node on mahti; use 28 or 32 (or at most 4 on one node)",
        ),
        (
            dict(cluster="lumi", gpus=12),
            "--gpus 12 is not a multiple of 8 GPUs per node on lumi; use 8 or 16 (or at most 8 on one node)",
        ),
        (
            dict(cluster="puhti", gpus=96),
            "--gpus 96 needs 24 nodes; the largest partition on puhti (gpu) allows at most 20 (80 GPUs)",
        ),
        (
            dict(cluster="mahti", gpus=8, partition="gpusmall"),
            "--gpus 8 needs 2 nodes; partition gpusmall on mahti allows at most 1 (4 GPUs)",
        ),
        (
            dict(cluster="mahti", gpus=4, time_limit="48:00:00"),
            "--time is above every partition's limit on mahti (the longest: gpusmall, 36:00:00)",
        ),
        (
            dict(cluster="mahti", gpus=4, partition="gputest", time_limit="01:00:00"),
            "--time is above partition gputest's limit of 00:15:00 on mahti",
        ),
        (
            dict(cluster="mahti", gpus=4, partition="gpu"),
            "--partition gpu: not a GPU partition of mahti (choose from gpusmall, gpumedium, gputest)",
        ),
        (
            dict(cluster="mahti", gpus=4, time_limit="4 hours"),
            f"--time '4 hours': expected {submit.TIME_FORMATS}",
        ),
        (
            dict(cluster="mahti", gpus=4, account=None),
            "--account is required on mahti (your project, e.g. project_2001234); or set APP_SUBMIT_ACCOUNT",
        ),
        (
            dict(cluster="mahti", gpus=4, account="p; rm -rf ~"),
            f"--account 'p; rm -rf ~': {submit.SAFE_HINT}",
        ),
        (
            dict(cluster="lumi", gpus=8, stage_gb=100, data_dir="/flash/x"),
            "--stage: lumi has no node-local scratch; drop --stage",
        ),
        (dict(cluster="mahti", gpus=0), "--gpus 0: must be >= 1"),
        (
            dict(cluster="mahti", gpus=4, stage_gb=100),
            "--stage needs --data-dir: the folder to copy to node-local disk",
        ),
        (
            dict(cluster="mahti", gpus=4, name="my job"),
            f"--name 'my job': {submit.SAFE_HINT}",
        ),
    ],
)
def test_errors(kw, message):
    with pytest.raises(UsageError) as err:
        render(kw.pop("cluster"), kw.pop("gpus"), **kw)
    assert str(err.value) == message


def test_values_are_quoted_never_pasted(tmp_path):
    marker = tmp_path / "pwned"
    evil = f"data.name=x; touch {marker}"
    job = render("local", 1, data_dir=f"/scratch/$(touch {marker})", sets=[evil])
    assert f"--set 'data.name=x; touch {marker}'" in job.script
    assert f"DATA_DIR='/scratch/$(touch {marker})'" in job.script
    # Run the script's variable lines and train line through bash with `app` replaced by echo: nothing executes.
    lines = [ln for ln in job.script.splitlines() if ln.startswith("DATA_DIR=") or " train " in ln]
    shell = "\n".join(lines).replace("/opt/venv/bin/python -m app", "echo")
    subprocess.run(["bash", "-c", f"RUN_DIR=r\n{shell}"], check=True, capture_output=True)
    assert not marker.exists()


def test_config_errors_surface_at_submit():
    with pytest.raises(UsageError, match="train.epochs must be int"):
        render("puhti", 4, sets=["train.epochs=3; touch /tmp/pwned"])
    with pytest.raises(UsageError, match="--config nope.yaml: no such file"):
        submit.render(submit.load_cluster("local"), 1, ["nope.yaml"])


@pytest.mark.parametrize(
    "args, line",
    [
        (["--cluster", "nope", "--gpus", "2", "-c", "configs/synthetic.yaml"],
         "Error: --cluster nope: unknown cluster; choose from local, lumi, mahti, puhti, roihu or add jobs/clusters/nope.yaml"),
        (["--cluster", "mahti", "--gpus", "30", "-c", "configs/synthetic.yaml", "--account", "p1", "--dry-run"],
         "Error: --gpus 30 is not a multiple of 4 GPUs per node on mahti; use 28 or 32 (or at most 4 on one node)"),
    ],
)  # fmt: skip
def test_cli_errors_one_line(args, line):
    result = CliRunner().invoke(cli, ["submit", *args])
    assert result.exit_code == 2 and result.output.strip() == line


def test_no_sbatch_on_path(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    result = CliRunner().invoke(
        cli, ["submit", "--cluster", "local", "--gpus", "1", "-c", "configs/synthetic.yaml"]
    )
    assert result.exit_code == 1
    assert result.output.strip() == (
        "Error: sbatch not found on PATH: run app submit on a login node of the cluster, or use --dry-run to see the script"
    )


def test_submit_starts_instantly_without_tensorflow():
    code = (
        "import sys; from app.cli import cli\n"
        "try:\n    cli.main(['submit', '--cluster', 'puhti', '--gpus', '8', '-c', 'configs/synthetic.yaml', "
        "'--account', 'p1', '--dry-run'], standalone_mode=False)\nexcept SystemExit:\n    pass\n"
        "print(sorted(m for m in ('tensorflow', 'horovod') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=GOLDEN.parents[1]
    ).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_invalid_cluster_profile(monkeypatch, tmp_path):
    (tmp_path / "broken.yaml").write_text("name: broken\ngpus_per_node: 4\npartitions: []\nsurprise: 1\n")
    monkeypatch.setattr(submit, "CLUSTERS", tmp_path)
    with pytest.raises(UsageError, match=r"broken.yaml: invalid cluster profile \(.*surprise"):
        submit.load_cluster("broken")


# --- Hostile strings through every submit input ------------------------------------------------------------
# Each is refused with one `Error:` line (exit 2), or rendered so that the script is valid bash, running it
# (srun and scontrol shimmed) creates no file, and `app train` receives the string intact as one argument.
MARK = "pwned"
HOSTILE = [
    f"x;touch {MARK};", f"x|touch {MARK}", f"x&touch {MARK}&", f"x&&touch {MARK}", f"x$(touch {MARK})",
    f"x`touch {MARK}`", f"x'touch {MARK}'", f"x'; touch {MARK}; '", f'x"; touch {MARK}; "',
    f'x"$(touch {MARK})"', f"x\ntouch {MARK}", f"x\rtouch {MARK}", f"x\r\ntouch {MARK}", f"x touch {MARK}",
    f"x\ttouch {MARK}", f"x#touch {MARK}", f"x >{MARK}", f"x<{MARK}", "x*", "*", "?", "-x", "--help", "x\\",
    f"x\\\ntouch {MARK}", "$HOME", f"x${{IFS}}touch${{IFS}}{MARK}", "ünïcødé", "名前", "x\u2028y", "x\x85y",
    "x\x1b[31my", "%x-%j", "~", "!!", "{a,b}", "x=y", ".", "..", "\u0661\u0662", "x\nSBATCH --x",
    f"x\n#SBATCH --wrap='touch {MARK}'",
]  # fmt: skip
SYNTHETIC = str(GOLDEN.parents[1] / "configs" / "synthetic.yaml")
LOCAL = ["--cluster", "local", "--gpus", "1", "-c", SYNTHETIC]
MAHTI = ["--cluster", "mahti", "--gpus", "4", "-c", SYNTHETIC, "--account", "project_2001234"]


def _config_named(tmp_path: Path, stem: str) -> str:
    folder = tmp_path / "configs"
    folder.mkdir(exist_ok=True)
    path = folder / f"{stem}.yaml"
    path.write_text(Path(SYNTHETIC).read_text())
    return str(path)


# input -> (args for `app submit`, the argv pair `app train` must receive if rendered, a word the error names)
INPUTS = {
    "--name": lambda s, tmp: (LOCAL + ["--name", s], None, "--name"),
    "--set name=": lambda s, tmp: (LOCAL + ["--set", f"name={s}"], ["--set", f"name={s}"], "name"),
    "config stem": lambda s, tmp: (
        ["--cluster", "local", "--gpus", "1", "-c", _config_named(tmp, s)],
        None,
        "pass --name",
    ),
    "config path": lambda s, tmp: (
        ["--cluster", "local", "--gpus", "1", "-c", _config_named(tmp, s), "--name", "job1"],
        ["-c", str(tmp / "configs" / f"{s}.yaml")],
        "--config",
    ),
    "--set value": lambda s, tmp: (
        LOCAL + ["--set", f"data.name={s}"],
        ["--set", f"data.name={s}"],
        "data.name",
    ),
    "--account": lambda s, tmp: (MAHTI[:-1] + [s], None, "--account"),
    "--partition": lambda s, tmp: (LOCAL + ["--partition", s], None, "--partition"),
    "--image": lambda s, tmp: (MAHTI + ["--image", s], None, "--image"),
    "--data-dir": lambda s, tmp: (LOCAL + ["--data-dir", s], ["--data-dir", s], "--data-dir"),
    "--data-dir staged": lambda s, tmp: (MAHTI + ["--data-dir", s, "--stage", "10"], None, "--data-dir"),
    "--time": lambda s, tmp: (LOCAL + ["--time", s], None, "--time"),
    "--cluster": lambda s, tmp: (["--cluster", s, "--gpus", "1", "-c", SYNTHETIC], None, "--cluster"),
}
SHIM = """#!/bin/bash
# Records its argv (NUL-separated) as the next numbered file in $SHIM_CALLS; runs nothing.
shopt -s nullglob
calls=("$SHIM_CALLS"/*)
printf '%s\\0' "${0##*/}" "$@" > "$SHIM_CALLS/${#calls[@]}"
"""


def run_sandboxed(script: str, tmp_path: Path) -> list[list[str]]:
    """Run a rendered job script in an empty folder with srun/scontrol shimmed; the argv of each call."""
    box, shims, calls = tmp_path / "box", tmp_path / "shims", tmp_path / "calls"
    for folder in (box, shims, calls):
        folder.mkdir()
    for tool in ("srun", "scontrol"):
        (shims / tool).write_text(SHIM)
        (shims / tool).chmod(0o755)
    path = tmp_path / "job.sbatch"
    path.write_text(script, encoding="utf-8")
    syntax = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr
    env = {
        "PATH": f"{shims}:/usr/bin:/bin", "HOME": str(box), "SHIM_CALLS": str(calls), "SLURM_JOB_ID": "77",
        "SLURM_NNODES": "1", "SLURM_JOB_NUM_NODES": "1", "SLURM_CPUS_PER_TASK": "1",
        "LOCAL_SCRATCH": "/nonexistent-scratch", "LC_ALL": "C.UTF-8",
    }  # fmt: skip
    proc = subprocess.run(["bash", str(path)], cwd=box, env=env, capture_output=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    assert sorted(os.listdir(box)) == [], "the script created files"
    assert proc.stdout.decode().startswith("scaleout: 1 node(s) x ")
    assert len(proc.stdout.decode().splitlines()) == 1, proc.stdout  # no injected output
    return [(calls / str(i)).read_bytes().decode().split("\0")[:-1] for i in range(len(os.listdir(calls)))]


def _adjacent(argv: list[str], pair: list[str]) -> bool:
    return any(argv[i : i + 2] == pair for i in range(len(argv) - 1))


@pytest.mark.parametrize("hostile", HOSTILE, ids=[repr(h)[1:-1][:24] for h in HOSTILE])
@pytest.mark.parametrize("where", list(INPUTS))
def test_hostile_strings_never_reach_a_shell(where, hostile, tmp_path):
    if where.startswith("config") and hostile in (".", ".."):
        pytest.skip("not a file name")
    args, pair, named = INPUTS[where](hostile, tmp_path)
    result = CliRunner().invoke(cli, ["submit", *args, "--dry-run"], color=True)  # keep escape sequences
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    if result.exit_code != 0:
        line = result.output.rstrip("\n")
        assert result.exit_code == 2 and "\n" not in line and line.startswith("Error: "), result.output
        assert len(line.splitlines()) == 1 and named in line, line
        return
    script = result.stdout_bytes.decode()  # .output would turn \r\n into \n
    calls = run_sandboxed(script, tmp_path)
    train = calls[-1]
    assert train[0] == "srun" and "train" in train, train
    job_name = script.split("#SBATCH --job-name=")[1].split("\n")[0]
    assert submit.SAFE.fullmatch(job_name) and _adjacent(train, ["--run-dir", f"runs/{job_name}-77"])
    if pair:
        assert _adjacent(train, pair), (pair, train)
    if where == "--data-dir staged":
        assert calls[0][-3:] == ["--", hostile, "/nonexistent-scratch/"], calls[0]
        assert _adjacent(train, ["--data-dir", f"/nonexistent-scratch/{hostile}"]), train
    if where == "--image":
        assert hostile in train
    assert len(calls) == (2 if where == "--data-dir staged" else 1)
