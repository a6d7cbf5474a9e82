"""app/engines/launch/rendezvous.py: Slurm's task variables to Horovod's, checked against Horovod's own host assignments; the
server (`app rendezvous`) for real; a rank that joins, a missing server and a missing rank, each one line."""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from app.core.errors import AppError, UsageError
from app.engines.launch import rendezvous
from conftest import ROOT


@pytest.mark.parametrize(
    "spec, counts", [("4", [4]), ("2(x3),1", [2, 2, 2, 1]), ("8(x2)", [8, 8]), ("1,3,2", [1, 3, 2])]
)
def test_slurm_task_counts(spec, counts):
    assert rendezvous.tasks_per_node(spec) == counts


@pytest.mark.parametrize("spec", ["", "0", "2(x0)", "x", "2(x3", "2x3", "-1", "2,,1", "\u0664"])
def test_bad_task_counts_are_one_line(spec):
    with pytest.raises(AppError) as err:
        rendezvous.tasks_per_node(spec)
    assert str(err.value).startswith("SLURM_TASKS_PER_NODE=") and "\n" not in str(err.value)


def _slurm_env(procid: int, node: int, local: int, spec: str, size: int) -> dict[str, str]:
    return {
        "SLURM_PROCID": str(procid), "SLURM_NODEID": str(node), "SLURM_LOCALID": str(local),
        "SLURM_STEP_TASKS_PER_NODE": spec, "SLURM_STEP_NUM_TASKS": str(size), "SLURMD_NODENAME": f"n{node}",
    }  # fmt: skip


@pytest.mark.parametrize("spec", ["2", "4(x2)", "2(x2),1", "1,3,2"])
def test_every_task_gets_what_horovodrun_would_give_it(spec):
    counts = rendezvous.tasks_per_node(spec)
    hosts = [f"n{i}" for i in range(len(counts))]
    plan = rendezvous.host_assignments(hosts, counts)  # Horovod's own (horovod.runner.common.util.hosts)
    assert len(plan) == sum(counts)
    for slot in plan:  # Slurm's block distribution numbers the tasks node by node, as Horovod's plan does
        node = hosts.index(slot.hostname)
        env = rendezvous.horovod_env(_slurm_env(slot.rank, node, slot.local_rank, spec, sum(counts)))
        assert env == {
            "HOROVOD_RANK": str(slot.rank), "HOROVOD_SIZE": str(slot.size),
            "HOROVOD_LOCAL_RANK": str(slot.local_rank), "HOROVOD_LOCAL_SIZE": str(slot.local_size),
            "HOROVOD_CROSS_RANK": str(slot.cross_rank), "HOROVOD_CROSS_SIZE": str(slot.cross_size),
            "HOROVOD_HOSTNAME": slot.hostname,
        }  # fmt: skip


@pytest.mark.parametrize(
    "change, message",
    [
        ({"SLURM_PROCID": None}, "but SLURM_PROCID is unset: start every rank with srun inside the job"),
        ({"SLURM_LOCALID": "x"}, "but SLURM_LOCALID is not a count: start every rank with srun"),
        ({"SLURM_STEP_TASKS_PER_NODE": None}, "but SLURM_TASKS_PER_NODE is unset"),
        ({"SLURM_STEP_NUM_TASKS": "5"}, "Slurm's task layout does not add up (SLURM_STEP_NUM_TASKS=5"),
        ({"SLURM_NODEID": "2"}, "Slurm's task layout does not add up"),
        ({"SLURM_LOCALID": "2"}, "Slurm's task layout does not add up"),
        (
            {"SLURM_STEP_NUM_NODES": "3"},
            "SLURM_STEP_NUM_NODES=3): start the ranks with one srun over the whole job",
        ),
    ],
)
def test_a_task_layout_that_does_not_add_up_is_one_line(change, message):
    env = {**_slurm_env(1, 0, 1, "2(x2)", 4), rendezvous.ADDR_VAR: "127.0.0.1", rendezvous.PORT_VAR: "1"}
    env.update({k: v for k, v in change.items() if v is not None})
    for k in (k for k, v in change.items() if v is None):
        env.pop(k)
    with pytest.raises(AppError) as err:
        rendezvous.join(env)
    assert message in str(err.value) and "\n" not in str(err.value)


SECRET = "0123456789abcdef" * 2


def _serve_in_thread(hosts: list[str], spec: str) -> tuple[int, threading.Event]:
    """The server (Horovod's store with scaleout's limits) in this process on 127.0.0.1, stopped by the event."""
    server = rendezvous.Server(hosts, rendezvous.tasks_per_node(spec), SECRET, "127.0.0.1", {"127.0.0.1"})
    stop = threading.Event()
    threading.Thread(target=lambda: (stop.wait(), server.stop()), daemon=True).start()
    return server.port, stop


def _rank_env(rank: int, port: int, size: int = 2) -> dict[str, str]:
    env = _slurm_env(rank, 0, rank, str(size), size)
    env.update(
        {
            rendezvous.ADDR_VAR: "127.0.0.1",
            rendezvous.PORT_VAR: str(port),
            "SLURM_JOB_ID": "9",
            rendezvous.TOKEN_VAR: SECRET,
        }
    )
    return env


@pytest.mark.parametrize("order", [[0, 1], [1, 0], [3, 1, 0, 5, 2, 4]])
def test_ranks_join_through_the_server_whoever_comes_first(order):
    size = len(order)
    port, stop = _serve_in_thread(["n0"], str(size))
    envs = [_rank_env(r, port, size) for r in range(size)]
    results: list[object] = [None] * size

    def join(i: int) -> None:
        try:
            results[i] = rendezvous.join(envs[i])
        except Exception as exc:  # reported below, with the other ranks' results
            results[i] = exc

    threads = {r: threading.Thread(target=join, args=(r,)) for r in order}
    for r in order:
        threads[r].start()
        time.sleep(0.2)  # ranks arrive at different times; the first ones wait for the last
    for t in threads.values():
        t.join(30)
    stop.set()
    assert results == [True] * size
    for r, env in enumerate(envs):
        assert (env["HOROVOD_RANK"], env["HOROVOD_SIZE"], env["HOROVOD_LOCAL_SIZE"]) == (
            str(r),
            str(size),
            str(size),
        )
        assert (env["HOROVOD_CONTROLLER"], env["HOROVOD_CPU_OPERATIONS"]) == ("gloo", "gloo")


def test_a_rank_that_never_arrives_is_named():
    port, stop = _serve_in_thread(["n0"], "2")
    env = {**_rank_env(0, port), rendezvous.TIMEOUT_VAR: "1"}
    started = time.monotonic()
    with pytest.raises(AppError) as err:
        rendezvous.join(env)
    stop.set()
    assert time.monotonic() - started < 10
    assert str(err.value) == (
        f"rank(s) 1 of 2 did not reach Horovod's rendezvous at 127.0.0.1:{port} within 1 s "
        "(HOROVOD_GLOO_TIMEOUT_SECONDS; raise it if ranks start slowly): see their lines in the job log"
    )
    assert "HOROVOD_RANK" not in env  # nothing half-set: Horovod is not started


def test_without_rank_0_the_others_say_where_to_look(monkeypatch):
    monkeypatch.setattr(rendezvous, "GRACE_S", 0)
    port, stop = _serve_in_thread(["n0"], "2")
    with pytest.raises(AppError) as err:
        rendezvous.join({**_rank_env(1, port), rendezvous.TIMEOUT_VAR: "1"})
    stop.set()
    assert str(err.value) == (
        f"rank 0 did not report every rank at Horovod's rendezvous at 127.0.0.1:{port} within 1 s "
        "(HOROVOD_GLOO_TIMEOUT_SECONDS): rank 0's line in the job log names the missing ranks"
    )


def test_no_server_is_one_line():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(AppError) as err:
        rendezvous.join(_rank_env(0, port))
    assert str(err.value).startswith(
        f"no Horovod rendezvous server at 127.0.0.1:{port} (Connection refused): "
    )


@pytest.mark.parametrize(
    "env, joined",
    [
        ({}, False),
        ({rendezvous.ADDR_VAR: "h", "HOROVOD_RANK": "0"}, False),
    ],  # no rendezvous; another launcher
)
def test_nothing_is_done_without_a_rendezvous_or_under_another_launcher(env, joined):
    before = dict(env)
    assert rendezvous.join(env) is joined and env == before


@pytest.mark.parametrize("value", ["0", "1.5", "abc", "-3"])
def test_a_bad_timeout_is_one_line(value):
    port, stop = _serve_in_thread(["n0"], "2")
    with pytest.raises(UsageError) as err:
        rendezvous.join({**_rank_env(0, port), rendezvous.TIMEOUT_VAR: value})
    stop.set()
    assert str(err.value).startswith(f"HOROVOD_GLOO_TIMEOUT_SECONDS={value!r}: whole seconds, 1 or more")


def _app_rendezvous(*args: str, env: dict[str, str] | None = None, **kwargs) -> subprocess.Popen:
    env = {**os.environ, rendezvous.TOKEN_VAR: SECRET} if env is None else env
    return subprocess.Popen([sys.executable, "-m", "app", "rendezvous", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env, **kwargs)  # fmt: skip


def test_app_rendezvous_prints_its_port_and_address_and_stops_on_sigterm():
    proc = _app_rendezvous("--hosts", socket.gethostname(), "--tasks-per-node", "2")
    try:
        port, address = proc.stdout.readline().split()
        assert address == socket.gethostbyname(
            socket.gethostname()
        )  # the address it listens on, not the name
        with socket.create_connection((address, int(port)), timeout=5):
            pass  # listening
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0 and proc.stderr.read() == ""
    finally:
        proc.kill()


def test_a_multi_node_job_on_a_name_that_resolves_to_loopback_listens_everywhere_and_says_so(
    monkeypatch, capfd
):
    # "127.0.1.1 <name>" (Debian): the other nodes know this node by another address, so a multi-node job's
    # server listens on every interface and gives the ranks the name; a one-node job's listens on 127.0.1.1.
    monkeypatch.setattr(socket, "gethostname", lambda: "n0")
    monkeypatch.setattr(
        rendezvous, "_addresses", lambda name, family=None: ["127.0.1.1"] if name == "n0" else []
    )
    assert rendezvous.bind_address(1) == ("127.0.1.1", "127.0.1.1") and capfd.readouterr().err == ""
    assert rendezvous.bind_address(2) == ("", "n0")
    assert capfd.readouterr().err == (
        "scaleout rendezvous: n0 has no address here the other nodes could use: listening on every interface "
        "(the job's nodes are still the only ones admitted)\n"
    )


def _delete(port: int, path: str, source: str = "127.0.0.1") -> int:
    """What Horovod's C++ store sends when a rank is through a scope (HTTPStore::Finalize: DELETE /scope/rank)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5, source_address=(source, 0))
    conn.request("DELETE", path)
    return conn.getresponse().status


def test_the_server_closes_once_every_rank_is_through_all_of_gloos_scopes():
    proc = _app_rendezvous("--hosts", "localhost", "--tasks-per-node", "2")
    try:
        port = int(proc.stdout.readline().split()[0])
        # Horovod's plan for 2 ranks on one node: global (2), local_localhost (2), cross_0 and cross_1 (1 each).
        for path in ("/global/0", "/local_localhost/0", "/cross_0/0", "/global/1", "/local_localhost/1"):
            assert _delete(port, path) == 200
        time.sleep(3 * rendezvous.POLL_S)
        assert proc.poll() is None  # rank 1 is not through cross_1 yet
        assert _delete(port, "/cross_1/1") == 200
        through = time.monotonic()
        # Still answering right after the last delete (a rank may read a key after its Finalize), then closed
        # once QUIET_S went by without a request.
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/global/0")
        assert conn.getresponse().status in (200, 404)
        assert proc.wait(timeout=rendezvous.QUIET_S + 10) == 0
        assert time.monotonic() - through >= rendezvous.QUIET_S - rendezvous.POLL_S
        assert (
            proc.stderr.read() == "scaleout rendezvous: all 2 ranks are through Gloo's rendezvous; closed\n"
        )
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", port), timeout=5).close()
    finally:
        proc.kill()


def test_a_connection_from_outside_the_job_is_turned_away_and_named_once(capfd):
    # Listening on every interface (the multi-node fallback), the job's nodes being 127.0.0.1 alone: 127.0.0.9
    # is this machine, but no address of the job's nodes.
    server = rendezvous.Server(["n0"], [2], SECRET, "", {"127.0.0.1"})
    try:
        for _ in range(2):
            with pytest.raises((ConnectionError, http.client.HTTPException)):
                _delete(server.port, "/global/0", source="127.0.0.9")
        assert _delete(server.port, "/global/0") == 200  # the job's own node is still admitted
    finally:
        server.stop()
    assert capfd.readouterr().err == (
        "scaleout rendezvous: turned away a connection from 127.0.0.9: not one of the job's nodes\n"
    )


def test_a_rank_without_the_jobs_secret_is_refused_in_one_line():
    port, stop = _serve_in_thread(["n0"], "2")
    with pytest.raises(AppError) as err:
        rendezvous.join({**_rank_env(0, port), rendezvous.TOKEN_VAR: "f" * 32})
    stop.set()
    assert str(err.value) == (
        f"Horovod's rendezvous server at 127.0.0.1:{port} refused this rank's SCALEOUT_RENDEZVOUS_TOKEN: every "
        "rank needs the one the job script gave the server (srun passes the job's environment on; do not change it)"
    )


@pytest.mark.parametrize("value", ["", "short", "0123456789ABCDEF" * 2])
def test_app_rendezvous_without_a_secret_is_one_line(value):
    env = {k: v for k, v in os.environ.items() if k != rendezvous.TOKEN_VAR}
    proc = _app_rendezvous("--hosts", "localhost", "--tasks-per-node", "2",
                           env={**env, rendezvous.TOKEN_VAR: value} if value else env)  # fmt: skip
    out, err = proc.communicate(timeout=30)
    what = "not 32-128 lowercase hex digits" if value else "unset"
    assert (proc.returncode, out) == (2, "") and err.startswith(
        f"Error: SCALEOUT_RENDEZVOUS_TOKEN is {what}: "
    )
    assert err.count("\n") == 1


@pytest.mark.parametrize(
    "args, line",
    [
        (["--hosts", "n0", "--tasks-per-node", "2(x2)"],
         "Error: --tasks-per-node 2(x2) counts 2 node(s) but --hosts names 1; pass Slurm's SLURM_TASKS_PER_NODE "
         "with the same job's node list"),
        (["--hosts", "n0,n0", "--tasks-per-node", "2(x2)"], "Error: --hosts n0,n0: a node is named twice"),
        (["--hosts", "n 0", "--tasks-per-node", "2"],
         "Error: --hosts: 'n 0' is not a host name (letters, digits, '.', '_', '-')"),
        (["--hosts", "n0", "--tasks-per-node", "two"],
         "Error: --tasks-per-node two: not Slurm's task counts per node (such as 4 or 2(x3),1)"),
    ],
)  # fmt: skip
def test_app_rendezvous_bad_arguments_are_one_line(args, line):
    proc = subprocess.run(
        [sys.executable, "-m", "app", "rendezvous", *args],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=ROOT,
    )
    assert (proc.returncode, proc.stdout, proc.stderr) == (2, "", line + "\n")


def test_a_server_on_a_loopback_name_admits_its_own_ranks():
    # Debian's "127.0.1.1 <name>": the server listens there, and its node's ranks connect from 127.0.0.1.
    server = rendezvous.Server(["n0"], [2], SECRET, "127.0.1.1", {"127.0.1.1"})
    try:
        conn = http.client.HTTPConnection("127.0.1.1", server.port, timeout=5)
        conn.request("DELETE", "/global/0")
        assert conn.getresponse().status == 200
    finally:
        server.stop()


def test_the_owner_of_a_connecting_socket_is_read_from_proc_net_tcp():
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with socket.create_connection(listener.getsockname(), timeout=5) as client:
            assert rendezvous.socket_owner(client.getsockname(), listener.getsockname()) == os.getuid()
        assert rendezvous.socket_owner(("10.9.9.9", 4242), listener.getsockname()) is None  # not this node's


def test_another_users_process_on_the_servers_node_is_turned_away():
    if os.geteuid() != 0:
        from conftest import IN_CI

        if IN_CI:
            pytest.fail("CI runs as root: this test connects as another uid")
        pytest.skip("needs root to connect as another user")
    server = rendezvous.Server(["n0"], [2], SECRET, "127.0.0.1", {"127.0.0.1"})
    client = (
        "import http.client, sys\n"
        "c = http.client.HTTPConnection('127.0.0.1', int(sys.argv[1]), timeout=5)\n"
        "try:\n    c.request('PUT', '/global/0', body=b'x'); print(c.getresponse().status)\n"
        "except (ConnectionError, http.client.HTTPException):\n    print('refused')\n"
    )
    try:
        as_other = subprocess.run(["/usr/bin/python3", "-c", client, str(server.port)], capture_output=True,
                                  text=True, timeout=30, user=12345, group=12345)  # fmt: skip
        as_us = subprocess.run(["/usr/bin/python3", "-c", client, str(server.port)], capture_output=True, text=True,
                               timeout=30)  # fmt: skip
    finally:
        server.stop()
    assert (as_other.stdout, as_us.stdout) == ("refused\n", "200\n"), as_other.stderr
