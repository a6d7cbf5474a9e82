"""The command line: version, help for every command, `app info --json`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from app import __version__
from app.cli import cli


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
    assert "install-stack: horovod 0.28.1 already installed" in proc.stdout
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
    assert info["keras"]["flavour"] == "tf_keras"
    assert info["keras"]["version"].startswith("2.18.")
    hvd = info["horovod"]
    assert hvd["version"] == "0.28.1"
    assert hvd["controllers"]["gloo"] is True
    assert hvd["tensor_operations"]["gloo"] is True
    # MPI support is compiled in exactly when mpicxx was there at build time (it is in CI).
    assert hvd["controllers"]["mpi"] is (shutil.which("mpicxx") is not None)
    assert info["gpu_count"] == len(info["gpus"])


def test_info_table_renders():
    result = CliRunner().invoke(cli, ["info"])
    assert result.exit_code == 0, result.output
    assert "Horovod" in result.output and "0.28.1" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["train", "--seed", "abc"],
            "Error: Invalid value for '--seed': 'abc' is not a valid integer. (see `app train -h`)",
        ),
        (["trainx"], "Error: No such command 'trainx'. Did you mean 'train'? (see `app -h`)"),
        (["report"], "Error: Missing argument 'INPUTS...'. (see `app report -h`)"),
    ],
)
def test_click_usage_errors_are_one_line_too(args, message):
    from conftest import run_app

    proc = run_app(args, expect=2)
    assert proc.stderr.strip() == message and proc.stdout == ""
