"""Container images, for real: singularity.def parsed; the CPU flavour built with podman, in the Dockerfile's two
stages (Horovod compiled in `builder`, its venv copied into a `runtime` without compilers), both from a local
Debian 12 base made with debootstrap; then `app info` and a 2-worker training run inside it.

Docker's engine and Apptainer cannot run on these machines; podman (with runc) can. The base image comes from
the host's own apt source (read from /etc/apt, never written here), and the host's CA bundle and cached
Horovod wheel are mounted into the build, not copied into the image.
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import IN_CI, ROOT

pytestmark = [pytest.mark.container, pytest.mark.slow]
BASE = "localhost/scaleout-debian12-base:test"
IMAGE = "localhost/scaleout:cpu-test"
PODMAN = ["podman", "--runtime", "runc"]
# podman asks runc for nofile=1048576 and nproc=32768, above what this sandbox lets a container have
# ("error setting rlimit ... operation not permitted"): ask for the host's own open-files limit and a
# thread budget that two TensorFlow workers stay well inside.
_NOFILE = resource.getrlimit(resource.RLIMIT_NOFILE)
LIMITS = ["--ulimit", f"nofile={_NOFILE[0]}:{_NOFILE[1]}", "--ulimit", "nproc=4096:4096"]


def test_dockerfile_gpu_flavour_neither_reinstalls_held_nccl_nor_builds_a_cpu_only_image():
    text = (ROOT / "Dockerfile").read_text()
    args = dict(re.findall(r'^ARG (\w+)=("[^"]*"|\S*)$', text, re.M))
    assert args["NCCL_PACKAGES"] == '""'  # the devel base holds NCCL: apt-get install would stop (exit 100)
    assert "--allow-change-held-packages ${NCCL_PACKAGES}" in text
    assert args["HOROVOD_GPU_OPERATIONS"] == "NCCL" and "tensorflow[and-cuda]" in args["TF_PACKAGE"]
    assert "grep -q '\\[X\\] NCCL'" in text and "is_cuda_build" in text  # GPU flavour checked while building


def test_singularity_def_sections_and_bootstrap():
    from spython.main.parse.parsers import SingularityParser

    text = (ROOT / "singularity.def").read_text()
    assert re.search(
        r"^Bootstrap: docker-daemon$", text, re.M
    )  # built from the Docker image, not from scratch
    recipe = SingularityParser(str(ROOT / "singularity.def")).recipe["spython-base"]
    assert recipe.fromHeader == "scaleout:gpu"
    assert recipe.cmd == 'exec app "$@"'  # %runscript
    assert "PATH=/opt/venv/bin:$PATH" in recipe.environ
    # TensorFlow's warnings (e.g. a GPU it cannot use) stay visible, as in the Docker image and job scripts.
    assert "TF_CPP_MIN_LOG_LEVEL=1" in recipe.environ and "TF_CPP_MIN_LOG_LEVEL=3" not in text
    assert not re.search(r"mahti|puhti", text, re.I)  # retired in 2026
    assert any(label.startswith("org.opencontainers.image.version") for label in recipe.labels)
    assert any(label.startswith("org.opencontainers.image.revision") for label in recipe.labels)
    tests = "\n".join(recipe.install)  # spython turns %test into a script
    assert "app info" in tests and "horovodrun --check-build" in tests
    assert re.search(r"^%help$", text, re.M)


def host_debian_mirror() -> tuple[str, str]:
    """(mirror URI, suite) of the host's own Debian apt source."""
    for path in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*.sources")]:
        if not path.is_file():
            continue
        text = path.read_text()
        deb822 = re.search(r"^URIs:\s*(\S+/debian)\s*$.*?^Suites:\s*(\S+)", text, re.M | re.S)
        if deb822:
            return deb822.group(1), deb822.group(2)
        one_line = re.search(r"^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)/?\s+(\S+)", text, re.M)
        if one_line:
            return one_line.group(1), one_line.group(2)
    pytest.fail("no Debian apt source on this host to bootstrap the base image from")


def run(cmd, timeout=1800, **kw):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert proc.returncode == 0, (
        f"{' '.join(map(str, cmd))} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    )
    return proc


@pytest.fixture(scope="module")
def image(tmp_path_factory):
    for tool in ("podman", "runc", "debootstrap"):
        if shutil.which(tool) is None:
            if IN_CI:
                pytest.fail(f"{tool} is not installed, but .ci/run installs podman, runc and debootstrap")
            pytest.skip(f"{tool} is not installed (apt-get install podman runc debootstrap)")
    if os.geteuid() != 0:
        pytest.skip("debootstrap and rootful podman need root")
    if subprocess.run(["podman", "image", "exists", BASE]).returncode != 0:
        mirror, suite = host_debian_mirror()
        root = tmp_path_factory.mktemp("debian12")
        run(["debootstrap", "--variant=minbase", suite, str(root), mirror])
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        run(["podman", "import", "-", BASE], stdin=tar.stdout)
        tar.wait()
    cache = Path(os.environ.get("SCALEOUT_WHEEL_CACHE", Path.home() / ".cache" / "scaleout" / "wheels"))
    cache.mkdir(parents=True, exist_ok=True)
    run([
        *PODMAN, "build", "--format", "docker", "--network", "host", "-t", IMAGE,
        "--build-arg", f"BUILDER_IMAGE={BASE}", "--build-arg", f"RUNTIME_IMAGE={BASE}",
        "--build-arg", "TF_PACKAGE=tensorflow-cpu==2.18.1", "--build-arg", "TF_KERAS_VERSION=2.18.0",
        "--build-arg", "HOROVOD_GPU_OPERATIONS=", "--build-arg", "HOROVOD_BUILD_CUDA_CC_LIST=",
        "--build-arg", "PIP_CERT=/run/host-ca.crt", "--build-arg", "SCALEOUT_WHEEL_CACHE=/wheels",
        "-v", "/etc/ssl/certs/ca-certificates.crt:/run/host-ca.crt:ro", "-v", f"{cache}:/wheels",
        str(ROOT),
    ], timeout=3000)  # fmt: skip
    return IMAGE


def test_image_app_info(image):
    proc = run([*PODMAN, "run", "--rm", *LIMITS, "--network", "host", image, "info", "--json"], timeout=300)
    info = json.loads(proc.stdout)
    assert info["tensorflow"] == "2.18.1" and info["keras"]["flavour"] == "tf_keras"
    assert info["horovod"]["version"] == "0.28.1"
    assert info["horovod"]["controllers"] == {"gloo": True, "mpi": True}
    user = run(
        [*PODMAN, "run", "--rm", *LIMITS, "--entrypoint", "id", image, "-u"], timeout=120
    ).stdout.strip()
    assert user == "1000"  # not root


def test_image_runtime_stage_has_no_compiler(image):
    """Horovod was compiled in the builder stage; the image that ships has its library, not the toolchain."""
    # (OpenMPI's mpicxx wrapper comes with openmpi-bin; without a compiler behind it, it compiles nothing.)
    probe = (
        "for t in g++ gcc cc c++ make nvcc cmake; do command -v $t; done; ls /usr/include/python3*/Python.h"
    )
    proc = subprocess.run(
        [*PODMAN, "run", "--rm", *LIMITS, "--entrypoint", "sh", image, "-c", probe],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.stdout.strip() == "", f"build tools in the runtime image:\n{proc.stdout}"
    assert "No such file" in proc.stderr  # the probe ran: ls found no Python headers
    # The builder's layers (its compilers and headers) are not in the image; the runtime's apt layer is.
    history = run([*PODMAN, "history", "--no-trunc", "--format", "{{.CreatedBy}}", image], timeout=120).stdout
    assert "libopenmpi-dev" not in history and "libopenmpi3" in history


def test_make_docker_train_trains_on_two_workers_as_the_host_user(image, tmp_path):
    # The documented workstation line (issue 23, item 3), run with podman on the CPU image: as a host user who
    # is not the image's (uid 1234 here, 1000 in the image), the image read-only, data and configs read-only.
    runs = tmp_path / "runs"
    runs.mkdir()
    os.chown(runs, 1234, 1234)
    runs.chmod(0o755)  # the host user's own folder: nobody else may write there
    train_args = ("--set model.name=resnet20 --set data.image_size=32 --set train.batch_size=8 "
                  "--set train.steps_per_epoch=2 --epochs 1")  # fmt: skip
    run_args = " ".join([*LIMITS, "--network", "host"])
    proc = run(
        ["make", "--no-print-directory", "docker-train", "FLAVOR=cpu", f"IMAGE={image}", f"ENGINE={' '.join(PODMAN)}",
         "CONFIG=configs/synthetic.yaml", f"RUNS={runs}", "DATA=", "DOCKER_NP=2", "RUN_AS=1234:1234",
         f"RUN_ARGS={run_args}", f"TRAIN_ARGS={train_args}"],
        cwd=ROOT, timeout=900,
    )  # fmt: skip
    (run_dir,) = runs.iterdir()
    assert run_dir.name.startswith("synthetic-"), proc.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["launcher"] == "horovodrun"
    assert summary["replica_weight_spread"] < 1e-6
    owners = {(p.stat().st_uid, p.stat().st_gid) for p in [run_dir, *run_dir.rglob("*")]}
    assert owners == {(1234, 1234)}, owners  # everything the run wrote is the host user's


def lumi_definition(**arguments: str) -> tuple[str, list[tuple[str, str]], str]:
    """containers/lumi.def's (%post, %files, %environment), its {{ ARGS }} filled from %arguments and ``arguments``."""
    text = (ROOT / "containers" / "lumi.def").read_text()
    section = re.search(r"^%arguments\n(.*?)^%", text, re.M | re.S).group(1)
    values = dict(line.strip().split("=", 1) for line in section.splitlines() if line.strip())
    text = re.sub(r"\{\{ (\w+) \}\}", lambda m: {**values, **arguments}[m.group(1)], text)
    body = {
        name: re.search(rf"^%{name}.*?\n(.*?)^%", text, re.M | re.S).group(1)
        for name in ("post", "files", "environment")
    }
    files = [tuple(line.split()) for line in body["files"].splitlines() if line.strip()]
    return body["post"], files, body["environment"]


def test_lumi_def_in_a_stand_in_for_lumis_container(image, tmp_path):
    """containers/lumi.def's %files, %post and %environment, run by podman in a stand-in for LUMI's TensorFlow
    container (Apptainer, proot and LUMI's .sif are not here): the CPU image with its venv as the "conda
    environment" (an activate script puts it on PATH, a .pth shows its packages to the system Python, as a
    conda environment's Python sees them) and scaleout removed from it. TensorFlow 2.18 CPU instead of 2.16
    ROCm, which the def's own TF_VERSION, TF_KERAS_VERSION and GPU_BUILD arguments allow for, and python3-venv,
    which a conda Python has built in. As LUMI's base deletes the Cray MPICH its Horovod is linked against
    (AMD's REMOVE_CRAY_DEPS), the stand-in deletes the MPI library its Horovod needs: %post must not load
    Horovod (issue 35: `horovodrun --check-build` there failed LUMI's build). Then `app`, as `singularity exec
    IMAGE app` finds it after %environment, runs from the new venv on that stand-in, with the host's MPI
    library bound back in as LUMI's binds bring back Cray MPICH."""
    standin = tmp_path / "standin"
    standin.mkdir()
    (standin / "Containerfile").write_text(f"""FROM {image}
USER root
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends python3-venv >/dev/null \\
    && rm -rf /var/lib/apt/lists/* \\
    && /opt/venv/bin/python -m pip uninstall -y -q scaleout && rm -rf /opt/scaleout \\
    && mkdir -p /opt/miniconda3/bin /usr/local/lib/python3.11/dist-packages \\
    && echo 'export PATH=/opt/venv/bin:$PATH CONDA_PREFIX=/opt/venv CONDA_DEFAULT_ENV=$1' > /opt/miniconda3/bin/activate \\
    && /opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \\
        > /usr/local/lib/python3.11/dist-packages/standin-conda.pth \\
    && find /usr/lib \\( -name 'libmpi.so.40*' -o -name 'libmpi_cxx.so.40*' \\) -delete
""")
    run([*PODMAN, "build", "--format", "docker", "-t", "localhost/scaleout:lumi-standin", str(standin)])
    post, files, environment = lumi_definition(TF_VERSION="2.18", TF_KERAS_VERSION="2.18.0", GPU_BUILD="none")
    context = tmp_path / "def"
    context.mkdir()
    (context / "post.sh").write_text(post)
    for source, _ in files:
        (shutil.copytree if (ROOT / source).is_dir() else shutil.copy)(ROOT / source, context / source)
    copies = "\n".join(f"COPY {source} {dest}" for source, dest in files)
    (context / "Containerfile").write_text(f"""FROM localhost/scaleout:lumi-standin
ARG PIP_CERT
{copies}
COPY post.sh /tmp/post.sh
RUN bash /tmp/post.sh
""")
    run([
        *PODMAN, "build", "--format", "docker", "--network", "host", "-t", "localhost/scaleout:lumi-test",
        "--build-arg", "PIP_CERT=/run/host-ca.crt", "-v", "/etc/ssl/certs/ca-certificates.crt:/run/host-ca.crt:ro",
        str(context),
    ], timeout=1200)  # fmt: skip
    (tmp_path / "env.sh").write_text(environment)
    python = [*PODMAN, "run", "--rm", *LIMITS, "--entrypoint", "/opt/venv/bin/python"]
    load = [*python, "localhost/scaleout:lumi-test", "-c", "import horovod.tensorflow"]
    unbound = subprocess.run(load, capture_output=True, text=True, timeout=300)
    # Deleted, as LUMI's base deletes Cray MPICH:
    assert unbound.returncode != 0 and "libmpi" in unbound.stderr, unbound.stderr
    # The host's OpenMPI (the image's Debian release), bound where the image's was.
    names = ("libmpi.so.40", "libmpi_cxx.so.40")
    host_mpi = [f"{p.resolve()}:{p}:ro" for name in names for p in Path("/usr/lib").glob(f"*/{name}")]
    assert len(host_mpi) == 2, "the host's OpenMPI (libopenmpi3) is needed to bind it back in"
    probe = "PATH=/usr/bin:/bin; . /env.sh; command -v app; app info --json"
    proc = run([
        *PODMAN, "run", "--rm", *LIMITS, "--user", "1000", "-v", f"{tmp_path / 'env.sh'}:/env.sh:ro",
        *(x for bind in host_mpi for x in ("-v", bind)),
        "--entrypoint", "bash", "localhost/scaleout:lumi-test", "-c", probe,
    ], timeout=300)  # fmt: skip
    where, _, report = proc.stdout.partition("\n")
    assert where == "/opt/scaleout/bin/app"  # the wrapper that activates the conda environment first
    info = json.loads(report)
    assert info["tensorflow"] == "2.18.1" and info["keras"]["flavour"] == "tf_keras"
    assert info["horovod"]["version"] == "0.28.1"  # the container's own Horovod, not a new build
    assert info["horovod"]["controllers"]["mpi"] is True  # it loads again with the host's MPI bound in
