"""`app doctor`: a real 2-worker allreduce checked and timed, the no-silent-fallback checks reported as
problems (exit 1, one line), NCCL's network read from its own log format, and bad options refused."""

from __future__ import annotations

import json
import os
import re

import pytest

from app.engines.diagnostics.doctor import bandwidths
from app.engines.diagnostics.nccllog import nccl_network, nccl_path, slingshot_used
from conftest import run_app


def test_two_workers_pass_every_check_and_time_a_correct_allreduce():
    proc = run_app(
        ["doctor", "--np", "2", "--megabytes", "1", "--iterations", "2", "--json"],
        env={"SCALEOUT_GPU_IMAGES_PER_S": "1e9"},  # no CPU makes a billion crops/s: the warning shows
    )
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert list(checks) == ["build", "devices", "world", "allreduce", "transport", "input"]
    rate = re.fullmatch(
        r"1 core makes ([\d,]+) ImageNet training crops/s \(a 400x400 JPEG photo\); x (\d+) core\(s\) per task = "
        r"([\d,]+) images/s; warning: a GPU here consumes about 1,000,000,000 \(SCALEOUT_GPU_IMAGES_PER_S\): it "
        r"would wait for data, give each task at least (\d+) cores if the node has them",
        checks["input"]["detail"],
    )
    assert rate, checks["input"]["detail"]
    per_core = int(rate.group(1).replace(",", ""))
    assert int(rate.group(2)) == max(1, (os.cpu_count() or 1) // 2)  # the node's CPUs shared by 2 workers
    assert per_core > 0 and int(rate.group(4)) == pytest.approx(1e9 / per_core, rel=0.01)
    assert all(c["ok"] for c in checks.values()), checks
    assert report["size"] == 2 and [r["rank"] for r in report["ranks"]] == [0, 1]
    assert "Horovod size 2 (launcher: HOROVOD_SIZE=2)" in checks["world"]["detail"]
    assert report["allreduce"]["bytes"] == 2**20 and report["allreduce"]["seconds"] > 0
    assert "1 MiB on /CPU:0" in checks["allreduce"]["detail"] and "wrong" not in checks["allreduce"]["detail"]
    assert "no NCCL on this path" in checks["transport"]["detail"]  # no GPU here: the CPU operations


def test_a_job_whose_ranks_did_not_join_is_a_problem_named_on_one_line():
    # The batch script of a 4-task job running `app doctor` without srun: Horovod's size is 1.
    proc = run_app(
        ["doctor", "--megabytes", "1", "--iterations", "1"],
        expect=1,
        env={
            "SLURM_PROCID": "0",
            "SLURM_NTASKS": "4",
            "SLURM_JOB_ID": "1",
            "SCALEOUT_RENDERED_BY": "0.0.9 000000000000",
        },
    )
    assert "PROBLEM" in proc.stdout  # the table still shows every check
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1, proc.stderr
    assert errors[0].startswith("Error: doctor: world: rank 0: this Slurm job has 4 tasks")
    assert "Traceback" not in proc.stderr
    # The job script came from another checkout than the scaleout running it: said once, and the checks go on.
    assert proc.stderr.count("scaleout doctor: warning: the scaleout running this job (0.1.0 ") == 1
    assert "is not the checkout that rendered its script (0.0.9 000000000000)" in proc.stderr


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--megabytes", "0"], "--megabytes"),
        (["--megabytes", "nan"], "--megabytes"),
        (["--megabytes", "9000"], "--megabytes 9000: at most 8192"),
        (["--iterations", "-1"], "--iterations"),
        (["--np", "0"], "--np"),
    ],
)
def test_bad_options_are_usage_errors(args, expected):
    proc = run_app(["doctor", *args], expect=2)
    assert expected in proc.stderr and "Traceback" not in proc.stderr
    assert len([ln for ln in proc.stderr.splitlines() if ln.strip()]) <= 3


def test_the_network_nccl_chose_is_read_from_its_log(tmp_path):
    # NCCL's own INFO format (host:pid:tid [device] NCCL INFO ...), as NCCL_DEBUG_FILE writes it.
    (tmp_path / "nccl.node1.123.log").write_text(
        "node1:123:456 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n"
        "node1:123:456 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v6)\n"
        "node1:123:456 [0] NCCL INFO Using network AWS Libfabric\n"
    )
    assert nccl_network(str(tmp_path)) == "AWS Libfabric"
    (tmp_path / "nccl.node1.123.log").write_bytes(b"\xff\xfe binary \x00 garbage\n")
    assert nccl_network(str(tmp_path)) is None
    assert nccl_network(None) is None


def test_the_plugin_provider_and_interfaces_are_read_from_the_log_and_say_whether_slingshot_carries_it(
    tmp_path,
):
    log = tmp_path / "nccl.nid005000.77.log"
    log.write_text(  # RCCL with LUMI's aws-ofi-rccl plugin on Slingshot-11
        "nid005000:77:80 [0] NCCL INFO NET/Plugin: Loaded net plugin AWS Libfabric (v6)\n"
        "nid005000:77:80 [0] NCCL INFO NET/OFI Selected Provider is cxi (found 4 nics)\n"
        "nid005000:77:80 [0] NCCL INFO Using network AWS Libfabric\n"
    )
    path = nccl_path(str(tmp_path))
    assert path == {"plugin": "Loaded net plugin AWS Libfabric (v6)", "provider": "cxi"}
    assert slingshot_used(path) == (True, "RDMA through libfabric's cxi provider")
    log.write_text(  # no plugin: RCCL's socket transport over the management network
        "nid005000:77:80 [0] NCCL INFO NET/Plugin : Plugin load returned 2 : librccl-net.so: cannot open shared object file\n"
        "nid005000:77:80 [0] NCCL INFO NET/Socket : Using [0]nmn0:10.252.1.5<0>\n"
        "nid005000:77:80 [0] NCCL INFO Using network Socket\n"
    )
    path = nccl_path(str(tmp_path))
    assert path == {"devices": ["nmn0"]}
    assert slingshot_used(path) == (False, "TCP sockets over nmn0, no RDMA: the OFI plugin did not load")
    log.write_text(
        "nid005000:77:80 [0] NCCL INFO NET/Socket : Using [0]hsn0:10.1.0.5<0> [1]hsn1:10.1.0.6<0>\n"
    )
    # RCCL's fallback when the plugin does not load on LUMI: TCP over the hsn interfaces is not Slingshot's RDMA.
    assert nccl_path(str(tmp_path)) == {"devices": ["hsn0", "hsn1"]}
    assert slingshot_used(nccl_path(str(tmp_path))) == (
        False,
        "TCP sockets over hsn, no RDMA: the OFI plugin did not load",
    )
    log.write_text(
        "nid005000:77:80 [0] NCCL INFO NET/OFI Selected provider is cxi, fabric is cxi (found 4 nics)\n"
    )
    assert nccl_path(str(tmp_path)) == {"provider": "cxi"} and slingshot_used({"provider": "cxi"})[0] is True
    log.write_text("nid005000:77:80 [0] NCCL INFO NET/OFI Selected Provider is tcp;ofi_rxm (found 1 nics)\n")
    assert slingshot_used(nccl_path(str(tmp_path))) == (False, "libfabric provider tcp;ofi_rxm, not cxi")
    log.write_bytes(b"\xff\xfe binary \x00 garbage\n")
    assert nccl_path(str(tmp_path)) == {} and slingshot_used({}) == (None, "")
    assert nccl_path(None) == {}


def test_bus_bandwidth_is_algorithm_bandwidth_times_2_n_minus_1_over_n():
    assert bandwidths(10**9, 1.0, 1) == (1.0, 0.0)
    algorithm, bus = bandwidths(10**9, 0.5, 4)
    assert algorithm == 2.0 and bus == pytest.approx(3.0)
    assert all(x != x for x in bandwidths(10**9, 0.0, 2))  # NaN, never a division by zero


def test_a_stop_signal_reports_what_it_found():
    """Issue 22, item 8: a smoke job's time limit (SIGTERM) ends app doctor with its table and one line, not
    a silent exit 143."""
    import signal
    import subprocess
    import sys
    import time

    from app.core.signals import catches as _catches
    from conftest import ROOT

    proc = subprocess.Popen(
        [sys.executable, "-m", "app", "doctor", "--megabytes", "1", "--iterations", "1000000000"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while not _catches(proc.pid, signal.SIGTERM):  # its handler is in place
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.2)
        time.sleep(5)  # into the checks
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == 1, err
    assert "stopped by SIGTERM before every check ended" in " ".join(out.split())
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert errors == [
        "Error: doctor: stopped: stopped by SIGTERM before every check ended (the job's time limit, or scancel); "
        "the rows above are what it found"
    ], err
    assert "Traceback" not in err


def test_a_detail_holding_rich_markup_is_printed_as_text():
    # SCALEOUT_GPU_IMAGES_PER_S='[/]' reaches the input row's detail: Rich must print it, not parse it.
    import io

    from rich.console import Console

    from app.engines.diagnostics.doctor import render

    out = io.StringIO()
    check = {"name": "input", "ok": True, "detail": "SCALEOUT_GPU_IMAGES_PER_S='[/]' is not a number [bold]"}
    warned = {
        "name": "input",
        "ok": True,
        "detail": "1 core makes 900 ...; warning: a GPU here consumes about 931",
    }
    render({"size": 1, "checks": [check, warned]}, Console(file=out, width=200))
    rows = out.getvalue().splitlines()
    assert any("'[/]' is not a number [bold]" in row and " ok " in row for row in rows), rows
    assert any("warning: a GPU" in row and " warning " in row for row in rows), rows  # never a green ok


def test_the_input_row_never_ends_the_doctor_in_a_traceback():
    from app.engines.diagnostics.doctor import Stopped, guarded_input_check

    def fails():
        raise RuntimeError("sample.jpg: no such file")

    def stopped():
        raise Stopped("SIGTERM")

    report: dict = {}
    row = guarded_input_check(report, fails)
    assert row == {
        "name": "input",
        "ok": True,
        "detail": "not measured (RuntimeError: sample.jpg: no such file)",
    }
    assert "stopped" not in report
    row = guarded_input_check(report, stopped)
    assert not row["ok"] and row["detail"] == "stopped by SIGTERM while measuring the input pipeline"
    assert report["stopped"] is True  # rank 0 then waits for nobody, as after any stop


class _OneProcess:
    """The engine as check_transport sees it: a name, and all_gather on a job of one process."""

    def __init__(self, name: str):
        self.name = name

    def all_gather(self, obj) -> list:
        return [obj]


@pytest.mark.parametrize(
    "engine_name, rocm, world, library, instead",
    [
        # the tf engine on ROCm: one process over 2 GCDs, MWMS asked for NCCL (RCCL) and its log stayed silent
        ("tf", True, {"size": 1, "replicas": 2}, "RCCL", "MirroredStrategy reduced through one device"),
        # across 2 processes (nodes), MWMS
        ("tf", True, {"size": 2}, "RCCL", "MultiWorkerMirroredStrategy fell back to TensorFlow's ring"),
        ("horovod", False, {"size": 2}, "NCCL", "Horovod reduced through its CPU operations (MPI or Gloo"),
    ],
)
def test_a_collective_library_that_never_initialised_on_gpus_is_a_warning(
    monkeypatch, engine_name, rocm, world, library, instead
):
    from app.engines import engine
    from app.engines.diagnostics.doctor import check_transport, render
    from app.engines.world import World

    monkeypatch.setattr(engine, "_current", _OneProcess(engine_name))
    build = {"version": "0.28.1", "tensor_operations": {"nccl": True}}
    gpus = ["/physical_device:GPU:0", "/physical_device:GPU:1"]
    check = check_transport(None, build, gpus, World(**world), {}, rocm=rocm, logged=True)
    assert check.ok  # a warning, not a problem: the allreduce row already says whether the sums were right
    assert check.detail.startswith(
        f"{library} never initialised; warning: {library} was expected for the allreduce over 2 GPUs, so {instead}"
    ), check.detail
    assert f"far slower than {library} between GPUs" in check.detail
    import io

    from rich.console import Console

    out = io.StringIO()
    render({"size": 1, "checks": [check.__dict__]}, Console(file=out, width=400))
    assert any(" warning " in row and "never initialised" in row for row in out.getvalue().splitlines())
    # Where it did initialise, where the log was the user's own (NCCL_DEBUG set), or on one GPU: no warning.
    named = check_transport("IB", build, gpus, World(**world), {}, rocm=rocm, logged=True)
    assert named.ok and named.detail == "NCCL/RCCL, network: IB"
    theirs = check_transport(None, build, gpus, World(**world), {}, rocm=rocm, logged=False)
    assert theirs.ok and theirs.detail == "NCCL/RCCL (its log named no network)"
    alone = check_transport(None, build, gpus[:1], World(), {}, rocm=rocm, logged=True)
    assert alone.ok and "warning" not in alone.detail


def test_a_stop_signal_ends_the_checks_once_and_a_second_one_does_not_interrupt_the_report():
    import signal

    from app.engines.diagnostics.doctor import Stopped, _stop_on_signals

    saved = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGTERM)}
    try:
        _stop_on_signals()
        with pytest.raises(Stopped):
            signal.raise_signal(signal.SIGUSR1)
        signal.raise_signal(signal.SIGTERM)  # as Apptainer's starter passes on what Slurm sent too: ignored
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        for s, handler in saved.items():
            signal.signal(s, handler)
