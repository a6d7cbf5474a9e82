"""The command line: version, help for every command, `app info --json`."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from app import __version__
from app.cli import cli
from conftest import ROOT, TINY_SYNTHETIC, run_app, tmpfs


def test_version():
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"scaleout, version {__version__}"


def test_help_lists_commands():
    result = CliRunner().invoke(cli, ["-h"])
    assert result.exit_code == 0
    for name in cli.commands:
        assert name in result.output


@pytest.mark.parametrize("name", sorted(cli.commands))
def test_every_command_has_help_with_example(name):
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0, result.output
    assert "Example:" in result.output


def test_unknown_command_is_usage_error():
    result = CliRunner().invoke(cli, ["trian"])
    assert result.exit_code == 2
    assert "No such command 'trian'" in result.output


@pytest.mark.parametrize(
    "args",
    [["--help"], ["submit", "--help"], ["report", "--help"], ["report", "results-that-do-not-exist.jsonl"]],
)
def test_login_node_commands_do_not_import_tensorflow(args):
    # `app --help`, `app submit` and `app report` must be instant on a login node: no TensorFlow, no Horovod.
    code = (
        "import sys; from app.cli import cli\n"
        f"try:\n    cli.main({args!r}, standalone_mode=False)\nexcept BaseException:\n    pass\n"
        "print(sorted(m for m in ('tensorflow', 'horovod', 'tf_keras') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().splitlines()[-1] == "[]"


def test_install_is_idempotent():
    # A second `make install` must not rebuild Horovod: the install script sees the same build key and stops.
    root = Path(__file__).resolve().parents[1]
    proc = subprocess.run(
        [str(root / "scripts" / "install-stack.sh"), sys.executable],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "install-stack: horovod 0.28.1 is already installed by this script for this environment"
        in proc.stdout
    )
    assert "building" not in proc.stdout


@pytest.fixture(scope="module")
def info():
    result = CliRunner().invoke(cli, ["info", "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_info_json_keys(info):
    assert {
        "scaleout",
        "python",
        "tensorflow",
        "keras",
        "horovod",
        "gpus",
        "gpu_count",
        "cpu_count",
        "tools",
        "tfds_data_dir",
    } <= set(info)
    assert set(info["tools"]) == {
        "horovodrun",
        "mpirun",
        "srun",
        "sbatch",
        "apptainer",
        "singularity",
        "docker",
        "podman",
    }
    assert info["scaleout"] == __version__


def test_info_reports_pinned_stack(info):
    assert info["tensorflow"] == "2.18.1"
    assert (
        info["tensorflow_build"]["cuda"] is False and info["tensorflow_build"]["rocm"] is False
    )  # tensorflow-cpu
    assert info["keras"]["flavour"] == "tf_keras"
    assert info["keras"]["version"].startswith("2.18.")
    hvd = info["horovod"]
    assert hvd["version"] == "0.28.1"
    assert hvd["controllers"]["gloo"] is True
    assert hvd["tensor_operations"]["gloo"] is True
    # MPI support is compiled in exactly when mpicxx was there at build time (it is in CI).
    assert hvd["controllers"]["mpi"] is (shutil.which("mpicxx") is not None)
    assert info["gpu_count"] == len(info["gpus"])
    assert info["engine_auto"] == "horovod"  # Horovod imports here: auto picks it


def test_info_table_renders():
    result = CliRunner().invoke(cli, ["info"])
    assert result.exit_code == 0, result.output
    assert "Horovod" in result.output and "0.28.1" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["train", "--seed", "abc"],
            "Error: Invalid value for '--seed': 'abc' is not a valid integer (ASCII digits 0-9) (see `app train -h`)",
        ),
        (["trainx"], "Error: No such command 'trainx'. Did you mean 'train'? (see `app -h`)"),
        (["report"], "Error: Missing argument 'INPUTS...'. (see `app report -h`)"),
    ],
)
def test_click_usage_errors_are_one_line_too(args, message):
    from conftest import run_app

    proc = run_app(args, expect=2)
    assert proc.stderr.strip() == message and proc.stdout == ""


@pytest.mark.parametrize(
    "args, message",
    [
        (["submit", "--cluster", "local", "--gpus", "\u0662"],
         "Invalid value for '--gpus': '\u0662' is not a valid integer (ASCII digits 0-9)"),
        (["submit", "--cluster", "local", "--gpus", "1_0"],
         "Invalid value for '--gpus': '1_0' is not a valid integer (ASCII digits 0-9)"),
        (["submit", "--cluster", "local", "--gpus", "9" * 200], "Invalid value for '--gpus': '99999"),
        (["train", "--np", "\uff12"], "Invalid value for '--np': '\uff12' is not a valid integer (ASCII digits 0-9)"),
        (["train", "--epochs", "1.5"], "Invalid value for '--epochs': '1.5' is not a valid integer (ASCII digits 0-9)"),
        (["benchmark", "--steps", "4"], "Invalid value for '--steps': 4 is not in the range x>=5."),
        (["benchmark", "--batch-sizes", "\u0663\u0662,64"],
         "Invalid value for '--batch-sizes': '\u0663\u0662,64': expected comma-separated integers (ASCII digits)"),
        (["data", "imagenet-to-tfrecord", "a", "b", "--workers", "\u0664"], "Invalid value for '--workers': '\u0664'"),
    ],
)  # fmt: skip
def test_integer_options_take_ascii_digits_only(args, message):
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert result.output.count("Error:") == 1


def test_every_integer_option_uses_the_ascii_type():
    from app.cli.base import Int

    def walk(group):
        for command in group.commands.values():
            yield from walk(command) if isinstance(command, click.Group) else [command]

    params = [(c.name, p) for c in walk(cli) for p in c.params]
    assert [(c, p.name) for c, p in params if isinstance(p.type, click.types.IntParamType)] == []
    assert {p.name for _, p in params if isinstance(p.type, Int)} >= {
        "gpus",
        "np_",
        "seed",
        "epoch",
        "workers",
    }


def test_errors_are_one_line_with_control_characters_escaped():
    # An AppError from deep inside (here an unknown --set key) and Click's own errors through main().
    result = CliRunner().invoke(cli, ["train", "--set", "foo\nbar=1"])
    assert (result.exit_code, result.output) == (
        2,
        "Error: --set: unknown key 'foo\\nbar'; top-level keys are the sections data, model, train, run and 'name'\n",
    )
    from conftest import run_app

    proc = run_app(["train", "--precision", "x\n\x1b[2Jy"], expect=2)
    assert proc.stderr.count("\n") == 1 and "\x1b" not in proc.stderr
    assert proc.stderr.startswith("Error: Invalid value for '--precision': 'x\\n\\x1b[2Jy' is not one of")


@pytest.mark.parametrize("free", [0, 8 * 1024])  # nothing left, and less than the probe's 64 KiB
def test_a_full_disk_at_the_start_of_training_is_one_line_and_leaves_nothing(tmp_path, free):
    # An empty file can still be made on a full disk: the writability probe writes and syncs 64 KiB.
    with tmpfs(tmp_path / "disk", "256k", free=free) as disk:
        proc = run_app(["train", *TINY_SYNTHETIC, "--run-dir", str(disk / "run")], expect=1)
        assert proc.stderr == (
            f"Error: --run-dir {disk / 'run'}: no room in {disk} (No space left on device): free some space (or "
            "raise the quota), or pass another --run-dir\n"
        )
        assert os.listdir(disk) == [".fill"]


@pytest.mark.parametrize("sbatch", [False, True])
def test_info_without_tensorflow_names_make_login_on_a_login_node(monkeypatch, tmp_path, sbatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("tensorflow", "tf_keras") else real(name, *a),
    )
    if sbatch:
        (tmp_path / "sbatch").write_text("#!/bin/sh\n")
        (tmp_path / "sbatch").chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    result = CliRunner().invoke(cli, ["info"])
    assert result.exit_code == 1
    line = f"Error: TensorFlow is not installed in this Python ({sys.executable}): run make install"
    login = (
        "; on a Slurm login node, `make login` installs the commands that run there (app submit, "
        "app study --cluster, app report) without TensorFlow, and training runs in the jobs they submit"
    )
    assert result.output.strip() == line + (login if sbatch else "")


def test_the_srun_examples_use_a_site_profiles_mpi():
    from app.cluster import profiles

    sites = {name: profiles.load_cluster(name).mpi for name in ("roihu", "lumi")}
    help_text = CliRunner().invoke(cli, ["doctor", "--help"]).output
    headers = [
        "".join(line for line in path.read_text().splitlines(True) if line.startswith("#"))
        for path in sorted((ROOT / "configs").glob("*.yaml"))
    ]
    shown = re.findall(r"--mpi=([a-z_0-9]+)", help_text + "".join(headers))
    assert shown and set(shown) <= set(sites.values()), (shown, sites)
