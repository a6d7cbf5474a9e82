"""Costs before submitting (issue 35, item 7): a profile's billing rule, checked; the cost of a job at its
time limit at the end of `app submit --dry-run`; a study's dry run as a summary with its total, the scripts
only with --show-scripts."""

from __future__ import annotations

import dataclasses
import math

import pytest
from click.testing import CliRunner
from test_study import app_main

from app.cli import cli
from app.cluster import billing, profiles
from app.core.errors import UsageError
from conftest import ROOT

SYNTHETIC = str(ROOT / "configs" / "synthetic.yaml")
ROIHU = (profiles.CLUSTERS / "roihu.yaml").read_text()
RULE = "billing:\n  unit: GPU-BU\n  per_gpu_hour: 200\n"


def _submit(args: list[str]):
    return CliRunner().invoke(cli, ["submit", *args, "--dry-run"])


def _last_line(text: str) -> str:
    return text.rstrip("\n").rsplit("\n", 1)[-1]


def test_shipped_profiles_name_the_sites_prices():
    roihu, lumi = profiles.load_cluster("roihu").billing, profiles.load_cluster("lumi").billing
    assert roihu == profiles.load_cluster("roihu-module").billing
    assert (roihu.unit, roihu.per_gpu_hour, roihu.slice_cpus, roihu.slice_memory_mib) == (
        "GPU-BU",
        200,
        None,
        None,
    )
    assert lumi == profiles.load_cluster("lumi-module").billing
    assert (lumi.unit, lumi.per_gpu_hour, lumi.slice_cpus, lumi.slice_memory_mib) == (
        "GPU-hours",
        0.5,
        8,
        64 * 1024,
    )
    assert profiles.load_cluster("local").billing is None


def test_a_roihu_dry_run_ends_with_its_cost_at_the_time_limit():
    result = _submit(
        ["--cluster", "roihu", "--gpus", "32", "-c", SYNTHETIC, "--account", "p1", "--time", "12:00:00"]
    )
    assert result.exit_code == 0, result.output
    # 32 GPUs x 12 h x 200 GPU-BU per GPU-hour (CSC's hpc-billing page)
    assert result.stderr.endswith(
        "Cost: at most 76,800 GPU-BU at the time limit (32 GPU(s) x 12 h x 200 GPU-BU per hour each)\n"
    )
    assert "Cost" not in result.stdout and result.stdout.startswith("#!/bin/bash")  # stdout: the script alone


@pytest.mark.parametrize(
    "gpus, time, expected",
    [
        # standard-g: 4 GPU-hours per node-hour (LUMI's example: 4 nodes x 24 h = 384 GPU-hours)
        ("32", "1-00:00:00", "at most 384 GPU-hours at the time limit (32 GPU(s) x 24 h x 0.5 GPU-hours"),
        # small-g: 0.5 per GCD-hour; 7 cores and 60G per GCD stay below LUMI's slices of 8 cores and 64 GB
        ("2", "1-00:00:00", "at most 24 GPU-hours at the time limit (2 GPU(s) x 24 h x 0.5 GPU-hours"),
    ],
)
def test_a_lumi_dry_run_bills_as_lumis_page(gpus, time, expected):
    result = _submit(
        ["--cluster", "lumi", "--gpus", gpus, "-c", SYNTHETIC, "--account", "p1", "--time", time]
    )
    assert result.exit_code == 0, result.output
    assert expected in _last_line(result.stderr)


def test_a_profile_without_a_rule_says_so():
    result = _submit(["--cluster", "local", "--gpus", "2", "-c", SYNTHETIC])
    assert result.exit_code == 0, result.output
    assert _last_line(result.stderr) == "Cost: no billing rule in the profile jobs/clusters/local.yaml"


def test_a_job_on_part_of_a_node_is_billed_for_the_slices_it_asks_for():
    cluster = profiles.load_cluster("lumi")
    # 3 GCDs of 16 cores each: ceil(48 / 8) = 6 slices, more than the 3 GCDs
    many_cores = dataclasses.replace(cluster, cpus_per_gpu=16)
    charge = billing.Charge("j", 3, 1, "small-g", 3600)
    assert billing.billed_gpus(many_cores, cluster.billing, charge) == 6
    # 3 GCDs of 100G each: ceil(300 / 64) = 5 slices
    much_memory = dataclasses.replace(cluster, mem_per_gpu="100G")
    assert billing.billed_gpus(much_memory, cluster.billing, charge) == 5
    assert "5 GPUs' worth (3 GPU(s) held)" in billing.job_cost(much_memory, charge)
    # a whole node holds its cores and memory: billed for its GPUs
    whole = billing.Charge("j", 8, 1, "standard-g", 3600)
    assert billing.billed_gpus(many_cores, cluster.billing, whole) == 8


@pytest.mark.parametrize("gpus, time_s", [(0, 3600), (1, 0), (-1, 3600), (1, -5)])
def test_nothing_is_priced_at_zero_or_below(gpus, time_s):
    with pytest.raises(UsageError, match="cannot price"):
        billing.cost(profiles.load_cluster("roihu").billing, gpus, time_s)


@pytest.mark.parametrize(
    "rule, problem",
    [
        ("  per_gpu_hour: 0", "billing.per_gpu_hour must be a number above 0"),
        ("  per_gpu_hour: -200", "billing.per_gpu_hour must be a number above 0"),
        ("  per_gpu_hour: .inf", "billing.per_gpu_hour must be a number above 0"),
        ("  per_gpu_hour: .nan", "billing.per_gpu_hour must be a number above 0"),
        ("  per_gpu_hour: true", "billing.per_gpu_hour must be a number above 0"),
        ('  per_gpu_hour: "200"', "billing.per_gpu_hour must be a number above 0"),
        ("  per_gpu_hour: 200\n  slice_cpus: 0", "billing.slice_cpus must be a whole number >= 1, got 0"),
        (
            '  per_gpu_hour: 200\n  slice_memory: "0"',
            "billing.slice_memory must be a quoted Slurm memory size",
        ),
        (
            "  per_gpu_hour: 200\n  slice_memory: 64",
            "billing.slice_memory must be a quoted Slurm memory size",
        ),
        (
            "  per_gpu_hour: 200\n  per_node_hour: 800",
            "unknown key billing.per_node_hour; known: unit, per_gpu_hour, slice_cpus, slice_memory",
        ),
    ],
)
def test_bad_billing_rules_are_one_line(rule, problem, monkeypatch, tmp_path):
    text = ROIHU.split("billing:")[0] + "billing:\n  unit: GPU-BU\n" + rule + "\n"
    (tmp_path / "bad.yaml").write_text(text)
    monkeypatch.setattr(profiles, "CLUSTERS", tmp_path)
    monkeypatch.chdir(tmp_path)
    result = _submit(["--cluster", "bad", "--gpus", "4", "-c", SYNTHETIC, "--account", "p1"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert problem in result.output and result.output.startswith("Error: ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]


@pytest.mark.parametrize("unit", ["''", "'GPU BU'", "'BU;rm'", "200"])
def test_a_bad_billing_unit_is_one_line(unit, monkeypatch, tmp_path):
    text = ROIHU.split("billing:")[0] + f"billing:\n  unit: {unit}\n  per_gpu_hour: 200\n"
    (tmp_path / "bad.yaml").write_text(text)
    monkeypatch.setattr(profiles, "CLUSTERS", tmp_path)
    result = _submit(["--cluster", "bad", "--gpus", "4", "-c", SYNTHETIC, "--account", "p1"])
    assert result.exit_code == 2 and result.output.count("\n") == 1, result.output
    assert "billing.unit" in result.output


def test_the_rule_the_docs_quote_is_the_profiles():
    assert RULE in ROIHU
    assert math.isclose(billing.cost(profiles.load_cluster("roihu").billing, 4, 4 * 3600), 3200)


def test_roihus_scaling_study_reaches_32_gpus_with_a_summary_and_its_total(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HOME", str(tmp_path))  # the study folder lies where Roihu's container sees it
    out = tmp_path / "studies"
    args = [
        "study",
        "scaling",
        "-c",
        SYNTHETIC,
        "--cluster",
        "roihu",
        "--gpus",
        "4,8,16,32",
        "--batch-sizes",
        "64",
        "--account",
        "project_2001234",
        "--out",
        str(out),
        "--dry-run",
    ]
    code, stdout, stderr = app_main(args, monkeypatch, capsys)
    assert code == 0, stderr
    # (4 + 8 + 16 + 32) GPUs x 4 h (the profile's default time) x 200; no report job (a login-node command)
    assert "4 Slurm job(s), 60 GPUs in all; at their time limits they cost at most 48,000 GPU-BU:\n" in stdout
    assert (
        "  workers-32: 32 GPU(s) on 8 node(s), partition gpularge, time limit 4 h: at most 25,600 GPU-BU"
        in stdout
    )
    assert "#SBATCH" not in stdout and "(the job scripts: add --show-scripts)" in stdout
    assert not out.exists()
    code, stdout, _ = app_main([*args, "--show-scripts"], monkeypatch, capsys)
    assert code == 0 and stdout.count("#!/bin/bash") == 4
    assert stdout.index("cost at most 48,000 GPU-BU") < stdout.index("#!/bin/bash")


def test_a_study_on_a_profile_without_a_rule_says_so(tmp_path, monkeypatch, capsys):
    code, stdout, stderr = app_main(
        [
            "study",
            "scaling",
            "-c",
            SYNTHETIC,
            "--cluster",
            "local",
            "--gpus",
            "1,2",
            "--batch-sizes",
            "8",
            "--out",
            str(tmp_path / "s"),
            "--dry-run",
        ],
        monkeypatch,
        capsys,
    )
    assert code == 0, stderr
    assert (
        "2 Slurm job(s), 3 GPUs in all; cost: no billing rule in the profile jobs/clusters/local.yaml\n"
        in stdout
    )


@pytest.mark.parametrize(
    "extra",
    [
        ["--np", "1", "--dry-run"],  # a dry run here: no job scripts
        ["--cluster", "local", "--gpus", "1"],  # no dry run
    ],
)
def test_show_scripts_outside_a_dry_run_on_slurm_is_refused(extra, tmp_path, monkeypatch, capsys):
    for kind in (["scaling", "--batch-sizes", "8"], ["large-batch", "--k", "1,2"]):
        words = [w.replace("--gpus", "--np") if kind[0] == "large-batch" else w for w in extra]
        code, stdout, stderr = app_main(
            ["study", *kind, "-c", SYNTHETIC, "--out", str(tmp_path / "s"), *words, "--show-scripts"],
            monkeypatch,
            capsys,
        )
        assert code == 2 and stderr.count("\n") == 1, stderr
        assert stderr.startswith(
            "Error: --show-scripts prints a dry run's job scripts: add --dry-run and --cluster"
        )
        assert not (tmp_path / "s").exists()


def test_a_smoke_job_under_an_hour_is_priced_in_minutes():
    result = CliRunner().invoke(
        cli, ["submit", "--cluster", "roihu", "--gpus", "8", "--account", "p1", "--smoke", "--dry-run"]
    )
    assert result.exit_code == 0, result.output
    # 8 GPUs x 10 minutes (SMOKE_TIME) x 200 GPU-BU per GPU-hour
    assert _last_line(result.stderr) == (
        "Cost: at most 266.67 GPU-BU at the time limit (8 GPU(s) x 10 min x 200 GPU-BU per hour each)"
    )
