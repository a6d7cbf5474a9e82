"""Image flavours, checked without building them: the Makefile's flavour table against the ARGs of each
Dockerfile, the gpu flavour's CUDA bases against TensorFlow 2.18.1's own CUDA pins, builder against runtime
base, tf_keras against TensorFlow per flavour, and that nothing meant for aarch64 installs PyPI's `and-cuda`
TensorFlow (a CPU-only build there). Roihu's containers/roihu.def (the ngc flavour built with Apptainer on the
GPU login node) is parsed and held to the ngc row; it and containers/ngc.Dockerfile both run
containers/install-scaleout.sh (its decisions: tests/test_install_scaleout.py); `make sif` runs with a stand-in
apptainer. The real builds are elsewhere: tests/test_container.py builds and runs the cpu flavour with podman;
gpu, ngc and lumi cannot be built here (no GPU registry, no aarch64, no Apptainer, no LUMI).

TensorFlow's pins come from tests/data/tensorflow-2.18.1-and-cuda.json, a copy of the and-cuda Requires-Dist of
the 2.18.1 wheel on PyPI, so these tests run offline; test_pins_copy_matches_pypi reads the same metadata from
PyPI again (pip fetches only the wheel's METADATA, by HTTP range requests) and fails in CI when they differ.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import IN_CI, ROOT, require_tool

PINS = json.loads((ROOT / "tests" / "data" / "tensorflow-2.18.1-and-cuda.json").read_text())
FLAVOURS = ["gpu", "cpu", "ngc"]  # built from a Dockerfile; lumi extends LUMI's .sif (containers/lumi.def)
DOCKERFILES = ["Dockerfile", "containers/ngc.Dockerfile"]
# Build-time plumbing, not part of what a flavour is: rows may leave these to the defaults.
PLUMBING = {"PIP_CERT", "PIP_VERSION", "SCALEOUT_WHEEL_CACHE", "SCALEOUT_VERSION", "GIT_REVISION"}
PLUMBING |= {"HOROVOD_VERSION", "NCCL_PACKAGES"}


@dataclass
class Stage:
    image: str
    name: str = ""
    args: dict[str, str | None] = field(default_factory=dict)
    runs: list[str] = field(default_factory=list)


def instructions(path: Path) -> list[str]:
    """The Dockerfile's instructions, continuation lines joined and comments dropped (as Docker does)."""
    out, buf = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and not buf):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        out.append(buf + line)
        buf = ""
    assert not buf, f"{path} ends inside a continued line"
    return out


def parse_dockerfile(path: Path) -> tuple[dict[str, str | None], list[Stage]]:
    """(ARGs before the first FROM, the stages) with each ARG's default (None when it has none)."""
    global_args: dict[str, str | None] = {}
    stages: list[Stage] = []
    for inst in instructions(path):
        word, _, rest = inst.partition(" ")
        word = word.upper()
        if word == "ARG":
            name, eq, value = rest.strip().partition("=")
            default = (shlex.split(value) or [""])[0] if eq else None
            (stages[-1].args if stages else global_args)[name] = default
        elif word == "FROM":
            parts = rest.split()
            image = re.sub(r"\$\{(\w+)\}", lambda m: global_args[m.group(1)] or "", parts[0])
            stages.append(Stage(image=image, name=parts[2] if len(parts) > 2 else ""))
        elif word == "RUN":
            stages[-1].runs.append(rest)
    return global_args, stages


def defaults(path: Path, name: str) -> set[str | None]:
    """Every default the Dockerfile gives ARG ``name`` (in each place it is declared)."""
    global_args, stages = parse_dockerfile(path)
    found = {global_args[name]} if name in global_args else set()
    found |= {s.args[name] for s in stages if name in s.args}
    return found


def make_dry_run(*args: str) -> subprocess.CompletedProcess:
    require_tool("make")
    return subprocess.run(
        ["make", "-n", "--no-print-directory", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )


@dataclass
class Row:
    dockerfile: Path
    platform: str
    build_args: dict[str, str]


def row(flavour: str) -> Row:
    """What `make image FLAVOR=flavour` would run, read from make's dry run (so the Makefile's own logic)."""
    proc = make_dry_run("image", f"FLAVOR={flavour}", "ENGINE=podman")
    assert proc.returncode == 0, proc.stderr
    command = next(
        line for line in proc.stdout.replace("\\\n", " ").splitlines() if line.startswith("podman build")
    )
    words = shlex.split(command)
    dockerfile, platform, build_args = "", "", {}
    for flag, value in zip(words, words[1:], strict=False):
        if flag == "-f":
            dockerfile = value
        elif flag == "--platform":
            platform = value
        elif flag == "--build-arg" and not value.startswith("GIT_REVISION="):
            name, _, val = value.partition("=")
            build_args[name] = val
    assert dockerfile, command
    return Row(ROOT / dockerfile, platform, build_args)


def pin(package: str) -> str:
    """TensorFlow 2.18.1's pinned version of ``package`` for its and-cuda extra."""
    for req in PINS["and_cuda"]:
        m = re.match(rf"{re.escape(package)}\s*==\s*([\w.]+)", req)
        if m:
            return m.group(1)
    raise AssertionError(f"{package} is not pinned in {PINS['and_cuda']}")


def cuda_image(image: str) -> tuple[str, str, str]:
    """nvidia/cuda:12.5.1-devel-ubuntu22.04 -> ('12.5', 'devel', 'ubuntu22.04')."""
    m = re.fullmatch(r"(?:docker\.io/)?nvidia/cuda:(\d+\.\d+)\.\d+-([\w-]+)-(ubuntu\d+\.\d+)", image)
    assert m, f"{image} is not an nvidia/cuda image tag this test understands"
    return m.group(1), m.group(2), m.group(3)


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_every_row_sets_exactly_what_its_dockerfile_declares(flavour):
    r = row(flavour)
    global_args, stages = parse_dockerfile(r.dockerfile)
    declared = set(global_args) | {name for s in stages for name in s.args}
    assert set(r.build_args) <= declared, f"{flavour}: not ARGs of {r.dockerfile.name}"
    # Every ARG that makes a flavour is set by every row, so none inherits another flavour's default.
    assert declared - PLUMBING <= set(r.build_args), f"{flavour} leaves these to the defaults"


def test_a_build_arg_has_one_default_in_every_stage():
    for name in DOCKERFILES:
        global_args, stages = parse_dockerfile(ROOT / name)
        for arg in set(global_args) | {a for s in stages for a in s.args}:
            assert len(defaults(ROOT / name, arg)) == 1, f"{name}: {arg} has different defaults per stage"


@pytest.mark.parametrize(
    ("flavour", "dockerfile"), [("gpu", "Dockerfile"), ("ngc", "containers/ngc.Dockerfile")]
)
def test_a_plain_docker_build_is_the_flavour_the_file_is_for(flavour, dockerfile):
    r = row(flavour)
    assert r.dockerfile == ROOT / dockerfile
    for name, value in r.build_args.items():
        assert defaults(r.dockerfile, name) == {value}, (
            f"{dockerfile}: {name}'s default is not the {flavour} row's"
        )


def test_gpu_bases_are_the_cuda_tensorflow_pins_and_carry_no_second_cudnn():
    r = row("gpu")
    cuda_runtime = pin("nvidia-cuda-runtime-cu12")  # 12.5.82
    builder, runtime = cuda_image(r.build_args["BUILDER_IMAGE"]), cuda_image(r.build_args["RUNTIME_IMAGE"])
    assert builder[0] == runtime[0] == ".".join(cuda_runtime.split(".")[:2])
    assert builder[1].endswith("devel")  # nvcc, nccl.h and libnccl_static.a for Horovod
    assert "devel" not in runtime[1]  # no toolkit in the image that ships
    # cuDNN (and cuBLAS, NCCL for TensorFlow) come from TensorFlow's pinned wheels; a cudnn base would add an
    # unpinned second copy beside nvidia-cudnn-cu12==9.3.0.75.
    assert "cudnn" not in runtime[1]
    assert r.build_args["TF_PACKAGE"] == f"tensorflow[and-cuda]=={PINS['version']}"
    assert pin("nvidia-cudnn-cu12").split(".")[0] == "9"
    assert r.platform == "linux/amd64"  # PyPI builds CUDA TensorFlow for x86_64 only


@pytest.mark.parametrize("flavour", ["gpu", "cpu"])
def test_builder_and_runtime_share_the_os_and_cuda(flavour):
    """The runtime stage copies the builder's venv, whose python is a link to the builder's python3."""
    r = row(flavour)
    builder, runtime = r.build_args["BUILDER_IMAGE"], r.build_args["RUNTIME_IMAGE"]
    if builder.startswith(("nvidia/cuda:", "docker.io/nvidia/cuda:")):
        (b_cuda, _, b_os), (r_cuda, _, r_os) = cuda_image(builder), cuda_image(runtime)
        assert (b_cuda, b_os) == (r_cuda, r_os), f"{builder} and {runtime} differ"
    else:
        assert builder == runtime, f"{flavour}: {builder} and {runtime} differ"
    _, stages = parse_dockerfile(r.dockerfile)
    assert [s.name for s in stages] == ["builder", "runtime"]
    runtime_stage = stages[-1]
    assert runtime_stage.image == defaults(r.dockerfile, "RUNTIME_IMAGE").pop()
    # Nothing in the runtime stage compiles: no compiler, no headers, no CUDA toolkit installed there.
    assert not re.search(
        r"\b(g\+\+|gcc|build-essential|-dev\b|cuda-toolkit|nvcc)", " ".join(runtime_stage.runs)
    )


def tensorflow_minor(flavour: str) -> str:
    args = row(flavour).build_args
    if "TF_PACKAGE" in args:
        return re.search(r"==(\d+\.\d+)\.", args["TF_PACKAGE"]).group(1)
    return args["TF_VERSION"]


@pytest.mark.parametrize("flavour", FLAVOURS)
def test_tf_keras_matches_tensorflow(flavour):
    keras = row(flavour).build_args["TF_KERAS_VERSION"]
    assert keras.rsplit(".", 1)[0] == tensorflow_minor(flavour)


def test_no_aarch64_flavour_installs_an_and_cuda_tensorflow():
    for flavour in FLAVOURS:
        r = row(flavour)
        if r.platform == "linux/amd64":
            continue  # x86_64 only: PyPI's and-cuda TensorFlow is a CUDA build there
        assert "and-cuda" not in " ".join(f"{k}={v}" for k, v in r.build_args.items()), flavour
        _, stages = parse_dockerfile(r.dockerfile)
        runs = " ".join(run for s in stages for run in s.runs)
        if "TF_PACKAGE" not in r.build_args:  # ngc: TensorFlow is the base's, never installed
            assert not re.search(r"pip install[^&;]*tensorflow(?!_)", runs), f"{flavour} installs TensorFlow"
    assert row("ngc").platform == "linux/arm64"
    assert row("ngc").build_args["BASE_IMAGE"] == "nvcr.io/nvidia/tensorflow:25.02-tf2-py3"


def guard(tmp_path: Path, tf_package: str, machine: str) -> subprocess.CompletedProcess:
    """Run the Dockerfile's own aarch64 guard (its RUN line) with `uname -m` answering ``machine``."""
    _, stages = parse_dockerfile(ROOT / "Dockerfile")
    run = next(r for r in stages[0].runs if "and-cuda" in r and "uname -m" in r)
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "uname").write_text(f"#!/bin/sh\necho {machine}\n")
    (shim / "uname").chmod(0o755)
    env = {**os.environ, "PATH": f"{shim}{os.pathsep}{os.environ['PATH']}", "TF_PACKAGE": tf_package}
    return subprocess.run(["bash", "-euo", "pipefail", "-c", run], env=env, capture_output=True, text=True)


def test_the_dockerfile_refuses_and_cuda_on_aarch64(tmp_path):
    refused = guard(tmp_path, "tensorflow[and-cuda]==2.18.1", "aarch64")
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "CPU-only" in refused.stderr and "FLAVOR=ngc" in refused.stderr
    assert guard(tmp_path, "tensorflow[and-cuda]==2.18.1", "x86_64").returncode == 0
    assert guard(tmp_path, "tensorflow-cpu==2.18.1", "aarch64").returncode == 0


def test_bad_flavours_stop_make_with_one_line():
    for flavour, says in [
        ("rocm", "not a flavour"),
        ("gpu;id", "not a flavour"),
        ("lumi", "make sif FLAVOR=lumi"),
    ]:
        proc = make_dry_run("image", f"FLAVOR={flavour}", "ENGINE=podman")
        assert proc.returncode == 2 and says in proc.stderr and proc.stderr.strip().count("\n") == 0, (
            proc.stderr
        )
        assert "podman build" not in proc.stdout
    quoted = make_dry_run("image", "FLAVOR=cpu", "IMAGE=x'$(id)", "ENGINE=podman")
    assert quoted.returncode == 2 and "single quote" in quoted.stderr


def lumi_def() -> tuple[str, dict[str, str]]:
    text = (ROOT / "containers" / "lumi.def").read_text()
    section = re.search(r"^%arguments\n(.*?)^%", text, re.M | re.S).group(1)
    arguments = dict(line.strip().split("=", 1) for line in section.splitlines() if line.strip())
    return text, arguments


def test_lumi_extends_lumis_own_tensorflow_container(tmp_path):
    text, arguments = lumi_def()
    assert re.search(r"^Bootstrap: localimage\nFrom: \{\{ BASE_SIF \}\}$", text, re.M)
    base = Path(arguments["BASE_SIF"]).name
    assert base.startswith("lumi-tensorflow-rocm-") and "-tensorflow-2.16.1-horovod-0.28.1" in base
    assert arguments["TF_VERSION"] == "2.16" and arguments["TF_KERAS_VERSION"].startswith("2.16.")
    assert arguments["GPU_BUILD"] == "rocm"
    # No TensorFlow of its own (and so no and-cuda one): tf_keras goes in without dependencies.
    post = re.search(r"^%post.*?\n(.*?)^%", text, re.M | re.S).group(1)
    assert "and-cuda" not in post and not re.search(r"pip install[^\n]*tensorflow(?!_)", post)
    assert re.search(r'pip install --no-deps "tf_keras==\{\{ TF_KERAS_VERSION \}\}"', post)
    assert re.search(r"^\s+export PATH=/opt/scaleout/bin:\$PATH$", text, re.M)  # `app` for `singularity exec`
    # `make sif FLAVOR=lumi` builds it with singularity, passing a base only when asked to.
    sif = tmp_path / "scaleout-lumi.sif"
    proc = run_make_sif(tmp_path, "FLAVOR=lumi", "LUMI_BASE_SIF=/appl/x.sif", f"SIF={sif}")
    assert proc.returncode == 0, proc.stderr
    assert (
        f"apptainer build --build-arg BASE_SIF=/appl/x.sif {sif} containers/lumi.def (cache:" in proc.stderr
    )
    proc = run_make_sif(tmp_path, "FLAVOR=lumi", f"SIF={sif}")
    assert proc.returncode == 0 and f"apptainer build {sif} containers/lumi.def (cache:" in proc.stderr


# The sections an Apptainer/Singularity definition of ours may hold (lumi.def, roihu.def), each at most once.
DEF_SECTIONS = {"arguments", "files", "post", "environment", "runscript", "test", "labels", "help"}


def test_lumi_def_is_a_well_formed_definition(tmp_path):
    """Sections Singularity knows, %files that exist, and %post (arguments filled in) that bash can parse.
    (spython, which tests/test_container.py uses for singularity.def, reads docker bootstraps only.)"""
    text, arguments = lumi_def()
    sections = re.findall(r"^%(\w+)", text, re.M)
    assert set(sections) <= DEF_SECTIONS
    assert len(sections) == len(set(sections))
    files = re.search(r"^%files\n(.*?)^%", text, re.M | re.S).group(1).split("\n")
    for line in filter(str.strip, files):
        source, dest = line.split()
        assert (ROOT / source).exists() and dest == f"/opt/scaleout/{source}"
    filled = re.sub(r"\{\{ (\w+) \}\}", lambda m: arguments[m.group(1)], text)
    assert "{{" not in filled  # every build argument has a default
    post = re.search(r"^%post -c /bin/bash\n(.*?)^%", filled, re.M | re.S).group(1)
    for body, shell in [
        (post, "bash"),
        (re.search(r"^%environment\n(.*?)^%", filled, re.M | re.S).group(1), "sh"),
    ]:
        (tmp_path / "body").write_text(body)
        proc = subprocess.run([shell, "-n", str(tmp_path / "body")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES)
def test_hadolint(dockerfile):
    hadolint = require_tool("hadolint")
    proc = subprocess.run([hadolint, str(ROOT / dockerfile)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_pins_copy_matches_pypi(tmp_path):
    """Read tensorflow 2.18.1's metadata from PyPI with pip (no download of the 600 MB wheel)."""
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
         "--report", str(report), "--use-feature=fast-deps", "--only-binary", ":all:", "--python-version",
         "3.10", "--platform", "manylinux2014_x86_64", "--target", str(tmp_path / "t"),
         f"tensorflow=={PINS['version']}"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if proc.returncode != 0:
        message = f"pip could not read tensorflow's metadata from PyPI: {proc.stderr.strip()[-500:]}"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    metadata = json.loads(report.read_text())["install"][0]["metadata"]
    assert metadata["version"] == PINS["version"]
    fresh = sorted(r for r in metadata["requires_dist"] if "extra == 'and-cuda'" in r)
    assert fresh == PINS["and_cuda"], "TensorFlow's CUDA pins on PyPI differ from tests/data: update both"


# --- Roihu: containers/roihu.def (Apptainer on the GPU login node) and the install script it shares with ngc ---
INSTALL_SCRIPT = ROOT / "containers" / "install-scaleout.sh"
MAKE_ENV = {
    k: v for k, v in os.environ.items() if k not in ("MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES")
}


def roihu_def() -> tuple[str, dict[str, str]]:
    text = (ROOT / "containers" / "roihu.def").read_text()
    section = re.search(r"^%arguments\n(.*?)^%", text, re.M | re.S).group(1)
    arguments = dict(line.strip().split("=", 1) for line in section.splitlines() if line.strip())
    return text, arguments


def test_roihu_def_is_the_ngc_flavour_from_ngcs_tensorflow_25_02():
    from spython.main.parse.parsers import SingularityParser

    text, arguments = roihu_def()
    recipe = SingularityParser(str(ROOT / "containers" / "roihu.def")).recipe["spython-base"]
    assert re.search(r"^Bootstrap: docker\nFrom: nvcr\.io/nvidia/tensorflow:25\.02-tf2-py3$", text, re.M)
    ngc = row("ngc").build_args
    assert recipe.fromHeader == ngc["BASE_IMAGE"] == "nvcr.io/nvidia/tensorflow:25.02-tf2-py3"
    # The same settings as `make image FLAVOR=ngc`: one image, whichever route builds it.
    assert arguments == {k: v for k, v in ngc.items() if k != "BASE_IMAGE"}
    # Roihu's profile launches with mpi: none, which needs Horovod's Gloo controller.
    assert re.search(r"^mpi: none\b", (ROOT / "jobs" / "clusters" / "roihu.yaml").read_text(), re.M)
    assert arguments["HOROVOD_CONTROLLER"] == "gloo"
    assert recipe.cmd == 'exec /opt/venv/bin/app "$@"'  # %runscript
    assert "PATH=/opt/venv/bin:$PATH" in recipe.environ and "TF_CPP_MIN_LOG_LEVEL=1" in recipe.environ
    assert "KERAS_HOME=${TMPDIR:-/tmp}/keras" in recipe.environ
    assert any(label.startswith("org.opencontainers.image.version") for label in recipe.labels)
    assert "app info" in "\n".join(recipe.install)  # spython turns %test into a script
    # The header says how to build it on roihu-gpu, as CSC advises, and what was verified how.
    header = text.split("Bootstrap:")[0]
    assert (
        "apptainer build --fakeroot" in header and "APPTAINER_CACHEDIR" in header and "$TMPDIR:/tmp" in header
    )
    assert "https://docs.csc.fi/computing/containers/overview/" in header and "never built here" in header


def test_roihu_def_is_a_well_formed_definition_that_runs_the_shared_script(tmp_path):
    text, arguments = roihu_def()
    sections = re.findall(r"^%(\w+)", text, re.M)
    assert set(sections) <= DEF_SECTIONS
    assert len(sections) == len(set(sections))
    files = re.search(r"^%files\n(.*?)^%", text, re.M | re.S).group(1)
    pairs = [line.split() for line in files.splitlines() if line.strip()]
    for source, dest in pairs:
        assert (ROOT / source).exists() and dest == f"/opt/scaleout/{source}"
    # Everything the script and install-stack.sh read from SCALEOUT_HOME (/opt/scaleout).
    assert {
        "pyproject.toml",
        "README.md",
        "app",
        "scripts/install-stack.sh",
        "containers/install-scaleout.sh",
    } <= {source for source, _ in pairs}
    filled = re.sub(r"\{\{ (\w+) \}\}", lambda m: arguments[m.group(1)], text)
    assert "{{" not in filled  # every build argument has a default
    post = re.search(r"^%post -c /bin/bash\n(.*?)^%", filled, re.M | re.S).group(1)
    assert re.search(r"^\s+bash /opt/scaleout/containers/install-scaleout\.sh all$", post, re.M)
    assert "pip " not in post and "venv" not in post  # the steps are the script's, not a copy of them
    for body, shell in [
        (post, "bash"),
        (re.search(r"^%environment\n(.*?)^%", filled, re.M | re.S).group(1), "sh"),
    ]:
        (tmp_path / "body").write_text(body)
        proc = subprocess.run([shell, "-n", str(tmp_path / "body")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr


def test_ngc_dockerfile_runs_the_shared_script_and_holds_no_copy_of_its_steps():
    global_args, stages = parse_dockerfile(ROOT / "containers" / "ngc.Dockerfile")
    runs = [run for s in stages for run in s.runs]
    script = "/opt/scaleout/containers/install-scaleout.sh"
    assert [r.split(" &&")[0] for r in runs if "install-scaleout.sh" in r] == [
        f"{script} stack",
        f"{script} app",
    ]
    copies = [i for i in instructions(ROOT / "containers" / "ngc.Dockerfile") if i.startswith("COPY ")]
    assert "COPY containers/install-scaleout.sh /opt/scaleout/containers/" in copies
    assert "COPY scripts/install-stack.sh /opt/scaleout/scripts/" in copies
    joined = "\n".join(runs)
    for step in (
        "pip list",
        "--format=freeze",
        "-m venv",
        "install-stack.sh",
        "--check-build",
        "pip install",
    ):
        assert step not in joined, (
            f"containers/ngc.Dockerfile still holds `{step}`: it belongs to {INSTALL_SCRIPT.name}"
        )
    assert global_args == {"BASE_IMAGE": "nvcr.io/nvidia/tensorflow:25.02-tf2-py3"}
    assert defaults(ROOT / "containers" / "ngc.Dockerfile", "HOROVOD_CONTROLLER") == {"gloo"}
    # The script's steps: what the Dockerfile did before, once.
    text = INSTALL_SCRIPT.read_text()
    assert text.count("pip list --format=freeze --exclude-editable") == 1
    assert "--system-site-packages" in text and "unset PIP_CONSTRAINT" in text
    assert re.search(r'pip install -q -c "\$constraints" "\$work/deps\[train\]"', text)
    assert not re.search(
        r"pip install[^\n]*tensorflow(?!_)", text
    )  # TensorFlow is the base's, never installed


def test_the_shared_script_parses():
    proc = subprocess.run(["bash", "-n", str(INSTALL_SCRIPT)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert os.access(INSTALL_SCRIPT, os.X_OK)  # the Dockerfile runs it directly


SHELL_SCRIPTS = [
    "containers/install-scaleout.sh",
    *sorted(f"scripts/{p.name}" for p in (ROOT / "scripts").glob("*.sh")),
]


@pytest.mark.parametrize("script", SHELL_SCRIPTS)
def test_shellcheck_finds_nothing_in_the_shell_scripts(script):
    shellcheck = require_tool("shellcheck")  # .ci/run installs it: CI never skips this
    proc = subprocess.run([shellcheck, str(ROOT / script)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout


def test_make_sif_def_builds_roihu_def_with_fakeroot(tmp_path):
    sif = tmp_path / "projappl" / "scaleout-ngc.sif"
    sif.parent.mkdir()
    proc = run_make_sif(tmp_path, "FLAVOR=ngc", "DEF=1", "ENGINE=podman", f"SIF={sif}", uid=1000)
    assert proc.returncode == 0, proc.stderr
    assert (
        f"apptainer build --fakeroot --bind={tmp_path}:/tmp {sif} containers/roihu.def (cache:" in proc.stderr
    )
    root = run_make_sif(tmp_path, "FLAVOR=ngc", "DEF=1", "ENGINE=podman", f"SIF={sif}", uid=0)
    assert (
        root.returncode == 0
        and f"apptainer build --bind={tmp_path}:/tmp {sif} containers/roihu.def" in root.stderr
    )
    # Run elsewhere than the repository's top folder, it says so before building anything.
    env = {
        **MAKE_ENV,
        "PATH": f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}",
        "FLAVOR": "ngc",
        "DEF": "1",
        "SIF": str(sif),
        "SIF_QUOTA_GIB": "15",
    }
    away = subprocess.run(
        ["bash", str(ROOT / "scripts" / "sif.sh")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert away.returncode == 1
    assert away.stderr == "sif: containers/roihu.def is not here: run make in the repository's top folder\n"


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["FLAVOR=ngc", "DEF=yes"], "DEF=yes is not 1"),
        (
            ["FLAVOR=gpu", "DEF=1"],
            "FLAVOR=gpu has no Apptainer definition; FLAVOR=ngc has containers/roihu.def",
        ),
        (["FLAVOR=ngc", "SIF_QUOTA_GIB=lots"], "SIF_QUOTA_GIB=lots is not a number of GiB"),
    ],
)
def test_bad_sif_inputs_stop_make_with_one_line(tmp_path, args, says):
    proc = run_make_sif(tmp_path, *args, "ENGINE=podman", f"SIF={tmp_path / 'x.sif'}")
    said = [line for line in proc.stderr.splitlines() if not line.startswith("make: ***")]  # make's own line
    assert proc.returncode == 2 and len(said) == 1 and says in said[0], proc.stderr
    assert "build" not in proc.stdout and "apptainer" not in proc.stderr and not (tmp_path / "x.sif").exists()


def run_make_sif(tmp_path: Path, *args: str, uid: int | None = None) -> subprocess.CompletedProcess:
    """`make sif` for real, with stand-ins for apptainer (writes a 4 KiB .sif), podman (holds no image), proot
    and, given ``uid``, `id -u`."""
    require_tool("make")
    shims = tmp_path / "bin"
    shims.mkdir(exist_ok=True)
    (shims / "apptainer").write_text(
        '#!/bin/bash\necho "apptainer $* (cache: $APPTAINER_CACHEDIR)" >&2\nhead -c 4096 /dev/zero > "${@: -2:1}"\n'
    )
    (shims / "podman").write_text('#!/bin/bash\n[ "$1 $2" != "image inspect" ]\n')
    (shims / "proot").write_text("#!/bin/bash\n")
    (shims / "id").unlink(missing_ok=True)
    if uid is not None:
        (shims / "id").write_text(
            f'#!/bin/bash\nif [ "$1" = -u ]; then echo {uid}; else exec {shutil.which("id")} "$@"; fi\n'
        )
    for shim in shims.iterdir():
        shim.chmod(0o755)
    env = {**MAKE_ENV, "PATH": f"{shims}{os.pathsep}{os.environ['PATH']}", "TMPDIR": str(tmp_path)}
    env.pop("APPTAINER_CACHEDIR", None)
    return subprocess.run(
        ["make", "--no-print-directory", "sif", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_make_sif_def_prints_the_sif_size_and_warns_above_the_quota(tmp_path):
    sif = tmp_path / "scaleout-ngc.sif"
    proc = run_make_sif(tmp_path, "FLAVOR=ngc", "DEF=1", f"SIF={sif}")
    assert proc.returncode == 0, proc.stderr
    assert (
        f"--bind={tmp_path}:/tmp {sif} containers/roihu.def (cache: {tmp_path}/apptainer-cache)"
        in proc.stderr
    )
    assert f"sif: {sif} is 4.0K (du -h)" in proc.stdout
    assert "warning" not in proc.stderr
    small = run_make_sif(tmp_path, "FLAVOR=ngc", "DEF=1", f"SIF={sif}", "SIF_QUOTA_GIB=0.000001")
    assert small.returncode == 0
    warning = [line for line in small.stderr.splitlines() if line.startswith("sif: warning")]
    assert warning == [
        f"sif: warning: {sif} is more than SIF_QUOTA_GIB=0.000001 GiB, the quota of /projappl on Roihu: keep it"
        " on /scratch/<project>/ (250 GiB) or ask CSC for more quota"
    ]


def test_make_sif_from_an_image_needs_the_image_first(tmp_path):
    proc = run_make_sif(tmp_path, "FLAVOR=ngc", "ENGINE=podman", f"SIF={tmp_path / 'x.sif'}")
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == (
        "sif: podman holds no image scaleout:ngc: run make image FLAVOR=ngc first, or build from"
        " containers/roihu.def: make sif FLAVOR=ngc DEF=1"
    )
    assert not (tmp_path / "x.sif").exists()
    none = run_make_sif(tmp_path, "FLAVOR=cpu", "ENGINE=", f"SIF={tmp_path / 'x.sif'}")
    assert none.returncode == 2
    assert none.stderr.splitlines()[0] == (
        "sif: neither a docker daemon nor podman is here to hold scaleout:cpu: make image FLAVOR=cpu on a machine"
        " with one"
    )
