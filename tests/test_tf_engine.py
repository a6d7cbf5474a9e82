"""The tf engine (TensorFlow's MirroredStrategy on one host, MultiWorkerMirroredStrategy across hosts, with tf_keras)
for real: its cluster across hosts from Slurm's variables and its refusals, 2 replicas of one process training,
evaluating and accumulating, the same weights as the Horovod engine on one worker, and the one-line refusals of
what it cannot do. `make test-tf221` runs them again in a venv
with TensorFlow 2.21 and no Horovod at all, but for the three that need the Horovod engine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import ROOT, TINY_SYNTHETIC, run_app

pytestmark = [pytest.mark.tf221]

# ------------------------------------------------------------------ the cluster, without TensorFlow


@pytest.mark.parametrize(
    "value",
    ["{", "[]", '{"cluster": {"worker": []}, "task": {"type": "worker", "index": 0}}',
     '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 1}}',
     '{"cluster": {"worker": ["a:1"], "chief": ["b:2"]}, "task": {"type": "worker", "index": 0}}',
     '{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}',
     '{"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": true}}', "\x00\xff",
     '{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", "index": true}}',
     '{"cluster": {"worker": ["nocolon"]}, "task": {"type": "worker", "index": 0}}',
     '{"cluster": {"worker": ["b:x"]}, "task": {"type": "worker", "index": 0}}',
     '{"cluster": {"worker": ["b:70000"]}, "task": {"type": "worker", "index": 0}}',
     '{"cluster": {"worker": ["a:1", "a:1"]}, "task": {"type": "worker", "index": 0}}'],
)  # fmt: skip
def test_a_tf_config_that_is_no_cluster_of_workers_is_one_line(value):
    from app.core.errors import AppError
    from app.engines import tfconfig

    with pytest.raises(AppError, match=r"^TF_CONFIG is not a cluster of workers .* unset it") as err:
        tfconfig.read_config({"TF_CONFIG": value})
    assert "\n" not in str(err.value)


def test_a_tf_config_that_no_launcher_started_is_taken_for_a_leftover():
    """A TF_CONFIG left in a workstation's shell would make a lone worker wait for peers that never come."""
    from app.core.errors import UsageError
    from app.engines import tfconfig

    stale = tfconfig._config(["localhost:1234", "localhost:1235"], 0)
    with pytest.raises(
        UsageError, match="^TF_CONFIG is set .* no srun step started this process .* unset TF_CONFIG"
    ):
        tfconfig.cluster({"TF_CONFIG": stale})


def test_two_workers_on_one_host_are_refused_in_one_line():
    from app.core.errors import UsageError
    from app.engines import tfconfig

    with pytest.raises(UsageError, match="puts 2 workers on gpu007: the tf engine runs one process per host"):
        tfconfig.check_one_per_host(["gpu007:20001", "gpu007:20002", "gpu008:20001"])
    tfconfig.check_one_per_host(["gpu007:20001", "gpu008:20001"])


def slurm_task(rank: int, node: int, **extra) -> dict[str, str]:
    return {"SLURM_PROCID": str(rank), "SLURM_NODEID": str(node), "SLURM_LOCALID": "0",
            "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_ID": "4242",
            "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "gpu[007-008]", "SCALEOUT_TF_PORT": "23456",
            **extra}  # fmt: skip


def test_a_slurm_step_becomes_one_tf_config_for_all_its_tasks():
    from app.engines import tfconfig

    configs = []
    for rank in (0, 1):
        env = slurm_task(rank, rank)
        workers, index = tfconfig.cluster(env)
        assert index == rank and json.loads(env["TF_CONFIG"])["task"]["index"] == rank
        configs.append(workers)
    assert configs[0] == configs[1] == ["gpu007:23456", "gpu008:23456"]  # one worker per node, the job's port


@pytest.mark.parametrize(
    "extra, words",
    [({"SCALEOUT_TF_PORT": ""}, "SCALEOUT_TF_PORT='': the tf engine across nodes needs the port its job script"),
     ({"SCALEOUT_TF_PORT": "80"}, "SCALEOUT_TF_PORT='80': the tf engine across nodes needs the port"),
     ({"SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_NUM_TASKS": "4"},
      "the tf engine runs one task per node, holding all of its GPUs; start srun with --ntasks-per-node=1"),
     ({"SLURMD_NODENAME": "gpu008"}, "this task runs on gpu008, but the step's node list puts node 0 at gpu007")],
)  # fmt: skip
def test_a_slurm_step_the_tf_engine_cannot_use_is_one_line(extra, words):
    from app.core.errors import AppError
    from app.engines import tfconfig

    with pytest.raises(AppError) as err:
        tfconfig.cluster(slurm_task(0, 0, **extra))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_tf_config_that_is_not_this_srun_step_s_is_refused_in_one_line():
    from app.core.errors import UsageError
    from app.engines import tfconfig

    stale = tfconfig._config(
        ["a:1234", "b:1235", "c:1236"], 0
    )  # a 3-worker TF_CONFIG from the submitting shell
    with pytest.raises(
        UsageError, match="names 3 workers with this one at index 0, but srun started 2 tasks and"
    ):
        tfconfig.cluster(slurm_task(1, 1, TF_CONFIG=stale))


def test_one_task_and_no_tf_config_is_one_worker():
    from app.engines import tfconfig

    assert tfconfig.cluster({}) is None
    assert tfconfig.cluster({"SLURM_PROCID": "0", "SLURM_STEP_NUM_TASKS": "1"}) is None


@pytest.mark.parametrize(
    "nodelist, hosts",
    [("gpu[001-003,007],login1", ["gpu001", "gpu002", "gpu003", "gpu007", "login1"]),
     ("nid[005-006]", ["nid005", "nid006"]), ("a,b", ["a", "b"]), ("r1n[8-10]", ["r1n8", "r1n9", "r1n10"]),
     ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]), ("gpu[01-02]-ib", ["gpu01-ib", "gpu02-ib"])],
)  # fmt: skip
def test_slurm_node_lists_expand_in_order(nodelist, hosts):
    from app.engines import tfconfig

    assert tfconfig.expand_hosts(nodelist) == hosts


def test_a_node_list_it_cannot_read_is_one_line():
    from app.core.errors import AppError
    from app.engines import tfconfig

    with pytest.raises(AppError, match=r"node list 'gpu\[a-b\]': 'a-b' is not a number"):
        tfconfig.expand_hosts("gpu[a-b]")
    for bad in ("gpu[01-02", "gpu[01-02]]", "gpu[1-2]x,gpu]", "", "a,,b", "gpu[05-03]"):
        with pytest.raises(AppError, match=r"^node list "):
            tfconfig.expand_hosts(bad)


def test_both_engines_implement_the_whole_interface(monkeypatch):
    """Each engine is a concrete Engine (abc refuses to make one that lacks a method), and use() returns it."""
    from app.engines import engine, horovod, tfdist

    monkeypatch.setattr(engine, "_current", None)  # this test's choice of engine ends with it

    for module in (horovod, tfdist):
        made = module.ENGINE_CLASS()
        assert isinstance(made, engine.Engine) and not made.__abstractmethods__
        assert made.name == engine.NAMES[module.__name__]
    assert engine.use("tf") is engine.current() and engine.current_name() == "tf"
    assert isinstance(engine.current(), tfdist.TfEngine)

    class Partial(engine.Engine):
        name = "partial"

    with pytest.raises(TypeError, match="abstract"):
        Partial()


def test_auto_is_tf_where_horovod_does_not_import_and_horovod_is_refused_there(monkeypatch):
    from app.core.errors import UsageError
    from app.engines import engine

    monkeypatch.setattr(engine, "horovod_imports", lambda: "Horovod is not installed")
    assert engine.resolve("auto") == "tf" and engine.resolve("tf") == "tf"
    with pytest.raises(UsageError, match="^train.engine horovod: Horovod is not installed; use --engine tf"):
        engine.resolve("horovod")
    monkeypatch.setattr(engine, "horovod_imports", lambda: None)
    assert engine.resolve("auto") == "horovod"


def test_an_unknown_engine_is_a_usage_error():
    proc = run_app(["train", *TINY_SYNTHETIC, "--engine", "mpi"], expect=2)
    assert "Invalid value for '--engine': 'mpi' is not one of 'auto', 'horovod', 'tf'" in proc.stderr
    proc = run_app(["train", *TINY_SYNTHETIC, "--set", "train.engine=tff"], expect=2)
    assert (
        "train.engine: unknown value 'tff' (choose from auto, horovod, tf); did you mean 'tf'?" in proc.stderr
    )


# ------------------------------------------------------------------ training on the tf engine


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.compat
def test_two_tf_replicas_train_evaluate_and_stay_in_sync(tmp_path):
    run = tmp_path / "run"
    proc = run_app(["train", *TINY_SYNTHETIC, "--epochs", "2", "--run-dir", str(run), "--np", "2", "--engine", "tf",
                    "--set", "train.eval_steps=2", "--accumulation-steps", "2",
                    "--set", "train.tf_accept_unauthenticated_grpc=true"])  # fmt: skip
    # The consent is this start's (one host needs none): the run's saved config keeps it false.
    assert "tf_accept_unauthenticated_grpc: false" in (run / "config.yaml").read_text()
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["engine"], summary["workers"], summary["launcher"]) == ("tf", 2, "local")
    assert (summary["accumulation_steps"], summary["global_batch"]) == (2, 32)  # MWMS with accumulation
    assert summary["replica_weight_spread"] == 0.0  # the same weights on both ranks
    assert "(tf engine: 2 replica(s) in one process, no port opened)" in proc.stderr
    out = proc.stdout + proc.stderr
    assert out.count("scaleout: ") == 1 and "launcher local, engine tf, local all-reduce" in out
    assert "[rank 1]" not in out, out  # rank 1 has nothing to say
    assert "eagerly has significant overhead" not in out and "grpc_server_lib" not in out
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in rows] == [1, 2]
    # The progress line's loss is the epoch's (Keras's metrics are sums over the ranks, not counted twice).
    assert f"loss {rows[-1]['loss']:.4f}" in proc.stdout
    # `app evaluate` on 2 workers of the same engine (the saved config's) scores the saved checkpoint as
    # training's last evaluation did: the batch-norm statistics were averaged before both.
    scores = run_app(["evaluate", str(run), "--np", "2", "--set", "train.eval_steps=2"])
    assert "top-1" in scores.stdout
    result = json.loads((run / "eval-epoch-0002.json").read_text())
    assert result["val_accuracy"] == pytest.approx(rows[-1]["val_accuracy"], abs=1e-9)
    assert (
        result["val_examples"] == rows[-1]["val_examples"] == 2 * 8 * 2
    )  # steps x batch x replicas, as Horovod
    # Each batch of 16 was split between the 2 replicas and their sums added: one replica evaluating the same
    # 32 examples in batches of 16 scores the same.
    run_app(["evaluate", str(run), "--set", "train.eval_steps=2", "--set", "train.batch_size=16"])
    alone = json.loads((run / "eval-epoch-0002.json").read_text())
    assert alone["val_examples"] == 32
    assert alone["val_accuracy"] == pytest.approx(result["val_accuracy"], abs=1e-9)
    assert alone["val_loss"] == pytest.approx(result["val_loss"], rel=1e-5)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.compat
def test_tf_accumulation_on_one_worker_equals_two_tf_workers(tmp_path):
    # The large-global-batch emulation on the tf engine: 1 worker x 2 accumulated passes == 2 workers x 1 pass
    # (2 replicas of one process, each given its own half of the process's batch).
    worker = str(ROOT / "tests" / "workers" / "accumulate.py")
    for out, accumulation, replicas in (("one", "2", "1"), ("two", "1", "2")):
        env = {**os.environ, "PYTHONPATH": str(ROOT), "SCALEOUT_REPLICAS": replicas}
        proc = subprocess.run([sys.executable, worker, str(tmp_path / f"{out}.npz"), accumulation, "tf"],
                              capture_output=True, text=True, timeout=600, env=env)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    subprocess.run([sys.executable, worker, str(tmp_path / "half.npz"), "1", "tf"], check=True,
                   capture_output=True, timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    one, two, half = (np.load(tmp_path / f"{n}.npz") for n in ("one", "two", "half"))
    assert bool(one["changed"]) and bool(two["changed"])
    names = [k for k in one.files if k != "changed"]
    assert names == [k for k in two.files if k != "changed"] and len(names) > 40
    for name in names:
        np.testing.assert_allclose(one[name], two[name], rtol=1e-5, atol=1e-6, err_msg=name)
    assert any(not np.allclose(half[n], one[n], rtol=1e-5, atol=1e-6) for n in names)  # not a trivial match


@pytest.mark.distributed
def test_app_doctor_checks_two_tf_replicas_and_times_a_correct_all_reduce():
    proc = run_app(
        ["doctor", "--np", "2", "--engine", "tf", "--megabytes", "1", "--iterations", "2", "--json"]
    )
    report = json.loads(proc.stdout)
    checks = {c["name"]: c for c in report["checks"]}
    assert list(checks) == ["build", "devices", "world", "allreduce", "transport", "input"]
    assert all(c["ok"] for c in checks.values()), checks
    assert "engine tf (MirroredStrategy)" in checks["build"]["detail"]
    assert "engine tf size 1 x 2 replicas (launcher: SCALEOUT_SIZE=1)" in checks["world"]["detail"]
    assert "controller tf-local, launched by local" in checks["world"]["detail"]
    assert report["allreduce"]["bytes"] == 2**20 and report["allreduce"]["seconds"] > 0
    assert "1 MiB on /CPU:0" in checks["allreduce"]["detail"] and "wrong" not in checks["allreduce"]["detail"]
    assert checks["transport"]["detail"].startswith(
        "TensorFlow's reduction between this process's devices (no"
    )


@pytest.mark.slow
@pytest.mark.horovod
def test_both_engines_train_one_worker_to_the_same_weights(tmp_path):
    from test_faults import RECIPE, weights

    for engine in ("horovod", "tf"):
        run_app(["train", *RECIPE, "--epochs", "2", "--run-dir", str(tmp_path / engine), "--engine", engine,
                 "--accumulation-steps", "2"])  # fmt: skip
    a, b = weights(tmp_path / "horovod", 2), weights(tmp_path / "tf", 2)
    assert sorted(a) == sorted(b) and len(a) > 40
    numbers = [n for n in a if isinstance(a[n], np.ndarray) and a[n].dtype.kind == "f"]
    assert len(numbers) > 40
    for name in numbers:  # the same steps, LRs and kernels: equal to float32 rounding of the sums' order
        np.testing.assert_allclose(a[name], b[name], rtol=1e-5, atol=1e-6, err_msg=name)
    # optimizer.iterations counts backward passes on both engines (Horovod's convention): 2 epochs x 6 steps
    counters = {n: (int(a[n]), int(b[n])) for n in a if "iter" in n and np.ndim(a[n]) == 0}
    assert counters and all(h == t == 2 * 6 for h, t in counters.values()), counters


@pytest.mark.parametrize("engine", [pytest.param("horovod", marks=pytest.mark.horovod), "tf"])
def test_each_engine_s_lr_callback_sets_the_schedule_s_lr_before_every_batch(engine):
    """One schedule code path: both engines' per-batch callbacks set initial_lr x multiplier(epoch + batch /
    steps), the tf engine's written out as Horovod's LearningRateScheduleCallback (staircase off) does it."""
    import importlib

    from app.core.compat import import_tensorflow

    tf = import_tensorflow()
    module = importlib.import_module("app.engines.horovod" if engine == "horovod" else "app.engines.tfdist")
    callback = module.ENGINE_CLASS().schedule_callback(0.8, lambda e: 1 / (1 + e), 0, None, 4)
    model = tf.keras.Sequential([tf.keras.Input((1,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    callback.set_model(model)
    seen = []
    for epoch in range(3):
        callback.on_epoch_begin(epoch)
        for batch in range(4):
            callback.on_train_batch_begin(batch)
            seen.append(float(model.optimizer.learning_rate.numpy()))
    expected = [0.8 / (1 + e + b / 4) for e in range(3) for b in range(4)]
    np.testing.assert_allclose(seen, expected, rtol=1e-6)


def test_without_tensorboard_a_run_says_so_and_writes_its_metrics(tmp_path, monkeypatch):
    """TensorFlow 2.20+ does not bring TensorBoard: run.tensorboard then says so in one line, it does not fail."""

    from app.training import output

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "tensorboard" else real(name, *a)
    )
    notes = []
    reporter = type("R", (), {"enabled": True, "note": lambda self, line: notes.append(line)})()
    writer = output.MetricsWriter(reporter, tmp_path, True, 8, 2)
    assert writer.writer is None and not (tmp_path / "tensorboard").exists()
    assert notes == [
        "run.tensorboard: TensorBoard is not installed here, so no TensorBoard logs (metrics.jsonl and metrics.csv "
        "have every value); pip install tensorboard, or set run.tensorboard=false"
    ]


@pytest.mark.slow
def test_fp16_with_loss_scaling_accumulates_on_the_tf_engine(tmp_path):
    """mixed_float16 on one worker with accumulation: the accumulating step scales the loss and unscales each
    micro-batch's gradients (Keras's LossScaleOptimizer), and the run trains to finite numbers."""
    run = tmp_path / "run"
    run_app(["train", *TINY_SYNTHETIC, "--epochs", "1", "--run-dir", str(run), "--engine", "tf",
             "--precision", "mixed_float16", "--accumulation-steps", "2", "--set", "train.steps_per_epoch=4"])  # fmt: skip
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["engine"], summary["precision"], summary["accumulation_steps"]) == (
        "tf",
        "mixed_float16",
        2,
    )
    assert np.isfinite(summary["final"]["loss"]) and np.isfinite(summary["final"]["val_loss"])


@pytest.mark.slow
@pytest.mark.horovod
def test_a_horovod_run_resumes_on_the_tf_engine(tmp_path):
    """A checkpoint holds the same variables under both engines: a run started under Horovod (with
    accumulation) continues under the tf engine, which records itself."""
    run = tmp_path / "run"
    run_app(["train", *TINY_SYNTHETIC, "--epochs", "1", "--run-dir", str(run), "--engine", "horovod",
             "--accumulation-steps", "2"])  # fmt: skip
    proc = run_app(["train", "--run-dir", str(run), "--epochs", "2", "--engine", "tf"])
    assert f"resumed from {run / 'checkpoints' / 'epoch-0001'}" in proc.stdout
    assert "resuming under the tf engine; the checkpoint was written under horovod" in proc.stdout
    summary = json.loads((run / "summary.json").read_text())
    assert (summary["engine"], summary["epochs"], summary["accumulation_steps"]) == ("tf", 2, 2)


def test_what_the_tf_engine_cannot_do_is_refused_in_one_line(tmp_path):
    proc = run_app(["train", *TINY_SYNTHETIC, "--engine", "tf", "--set", "train.fp16_allreduce=true",
                    "--run-dir", str(tmp_path / "run")], expect=2)  # fmt: skip
    assert proc.stderr.strip() == (  # refused before anything starts
        "Error: train.fp16_allreduce: Horovod's compression of gradients on the wire, which the tf engine lacks; "
        "set it to false, or use --engine horovod"
    )
    assert not (tmp_path / "run").exists()
    proc = run_app(["benchmark", *TINY_SYNTHETIC, "--engine", "tf", "--timeline", "--results",
                    str(tmp_path / "b.jsonl")], expect=2)  # fmt: skip
    assert proc.stderr.strip() == (
        "Error: --timeline records Horovod's timeline; the tf engine has none: drop --timeline, or use "
        "--engine horovod"
    )


# ------------------------------------------------------------------ joining across hosts


def _across_hosts_env(tmp_path) -> dict[str, str]:
    """Rank 0 of a 2-node srun step whose other node never comes (its name does not resolve)."""
    import random
    import socket

    from app.core.ports import TF_PORT_BASE, TF_PORT_SPAN

    for port in random.sample(
        range(TF_PORT_BASE, TF_PORT_BASE + TF_PORT_SPAN), 50
    ):  # as a job script draws it
        with socket.socket() as s:
            try:
                s.bind(("", port))
                break
            except OSError:
                continue
    return {**os.environ, "PYTHONPATH": str(ROOT), "SLURM_PROCID": "0", "SLURM_NODEID": "0", "SLURM_LOCALID": "0",
            "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_JOB_ID": "1", "SLURM_STEP_ID": "0",
            "SCALEOUT_TF_HOSTS": "localhost,peer-that-never-came.invalid", "SCALEOUT_TF_PORT": str(port),
            "TMPDIR": str(tmp_path)}  # fmt: skip


def test_a_run_across_hosts_needs_consent_naming_what_it_opens(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "app", "train", *TINY_SYNTHETIC, "--engine", "tf", "--run-dir",
                           str(tmp_path / "run")], env=_across_hosts_env(tmp_path), capture_output=True, text=True,
                          timeout=300, cwd=ROOT)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(
        "Error: 2 hosts with the tf engine: TensorFlow's MultiWorkerMirroredStrategy"
    ), proc.stderr
    assert "--set train.tf_accept_unauthenticated_grpc=true" in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_worker_whose_peer_never_comes_ends_at_its_deadline_and_on_sigterm(tmp_path):
    import signal

    args = [sys.executable, "-m", "app", "train", *TINY_SYNTHETIC, "--engine", "tf", "--run-dir", str(tmp_path / "r"),
            "--set", "train.tf_accept_unauthenticated_grpc=true", "--set", "train.tf_join_timeout_s=8"]  # fmt: skip
    env = _across_hosts_env(tmp_path)
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == -signal.SIGKILL, proc.stderr  # ended by its watcher: TensorFlow holds the GIL
    (error,) = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert error == (
        "Error: the tf engine's workers did not all join within 8 s (train.tf_join_timeout_s): no answer from "
        f"peer-that-never-came.invalid:{env['SCALEOUT_TF_PORT']}; check that every node started its task (the "
        "job log), or raise train.tf_join_timeout_s"
    )
    # SIGTERM to the step's processes while it waits (what scancel sends): it ends at once, whatever the deadline,
    # with the stopped status (3, resumable), not as a crash: SIGQUIT's handler during the join is _exit.
    args[-1] = "train.tf_join_timeout_s=600"
    err = _stop_a_joining_worker(tmp_path, args, signal.SIGTERM, True)
    assert "Error: stopped by SIGTERM while the tf engine's workers were joining; nothing was trained" in err
    assert not (tmp_path / "r" / "checkpoints").exists()
    # SIGUSR1 to the worker alone (not its watcher): its handler's wakeup fd tells the watcher; SIGHUP to the
    # group (a closed terminal): the watcher takes it, the worker ignores it while it joins. The same end.
    for sig, group in ((signal.SIGUSR1, False), (signal.SIGHUP, True)):
        _stop_a_joining_worker(tmp_path, args, sig, group)


def test_a_join_that_succeeds_returns_the_strategy_and_puts_every_handler_back():
    """The watcher ends quietly when the peers came in time, and the process keeps no trace of the join: its
    signal handlers and Python's wakeup fd are as before (a stand-in TensorFlow whose strategy starts at once)."""
    import signal
    import types

    from app.engines import tfjoin

    made = object()
    fake = types.SimpleNamespace(
        errors=types.SimpleNamespace(OpError=type("OpError", (Exception,), {})),
        distribute=types.SimpleNamespace(
            experimental=types.SimpleNamespace(
                CommunicationImplementation=types.SimpleNamespace(NCCL="nccl", RING="ring"),
                CommunicationOptions=lambda implementation: implementation,
            ),
            MultiWorkerMirroredStrategy=lambda communication_options: made,
        ),
    )
    numbers = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGHUP, signal.SIGQUIT)
    before = {n: signal.getsignal(n) for n in numbers}
    assert tfjoin.join(fake, False, ["localhost:20001", "peer:20001"], 0, 30.0) is made
    assert {n: signal.getsignal(n) for n in numbers} == before
    assert signal.set_wakeup_fd(-1) == -1  # none left set


def _stop_a_joining_worker(tmp_path, args, sig, group: bool) -> str:
    """Start ``args`` as a worker whose peer never comes, send ``sig`` (to its process group, or to it alone)
    once it waits inside TensorFlow's join, and check that it ends within seconds with status 3; its stderr."""
    import signal
    import time

    env = _across_hosts_env(tmp_path)
    waiting = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                               start_new_session=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while subprocess.run(["ss", "-ltnH", f"sport = :{env['SCALEOUT_TF_PORT']}"], capture_output=True,
                         text=True).stdout.strip() == "":  # fmt: skip
        assert waiting.poll() is None and time.monotonic() < deadline, waiting.communicate()
        time.sleep(0.2)
    time.sleep(1)
    t0 = time.monotonic()
    os.killpg(waiting.pid, sig) if group else os.kill(waiting.pid, sig)
    _, err = waiting.communicate(timeout=30)
    assert waiting.returncode == 3 and time.monotonic() - t0 < 5, err
    assert f"Error: stopped by {signal.Signals(sig).name} while the tf engine's workers were joining" in err
    return err


@pytest.mark.parametrize(
    "value, gpus, expected",
    [
        ("", 0, 1),
        ("", 4, 4),
        ("2", 4, 2),
        ("0", 0, None),
        ("-1", 0, None),
        ("abc", 0, None),
        ("999999999", 0, None),
    ],
)
def test_the_replicas_of_a_process_come_from_the_launcher_or_its_gpus(value, gpus, expected):
    from app.core.errors import UsageError
    from app.engines import tfdist

    env = {"SCALEOUT_REPLICAS": value} if value else {}
    if expected is None:
        with pytest.raises(
            UsageError, match="^SCALEOUT_REPLICAS=.*: a whole number of replicas from 1 to 256"
        ):
            tfdist.replicas_from_env(env, gpus)
    else:  # unset: one per GPU the process sees (a user's own srun with one task per node), else one
        assert tfdist.replicas_from_env(env, gpus) == expected


def test_the_local_launcher_keeps_nccl_on_loopback_and_drops_an_outer_replica_count(monkeypatch):
    from app.engines.launch import local

    seen = {}
    monkeypatch.setenv("SCALEOUT_REPLICAS", "7")
    monkeypatch.setattr(local, "launch_tf", lambda np, argv, env: seen.update(env) or 0)
    assert local.launch_local(2, ["train"], "tf") == 0
    assert seen["NCCL_SOCKET_IFNAME"] == "lo" and "SCALEOUT_REPLICAS" not in seen
