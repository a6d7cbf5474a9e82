"""What pyproject.toml cannot say: the wheel ships the clone's jobs/ and configs/ as package data.

The login-node commands read the cluster profiles (jobs/clusters/*.yaml), the job template (jobs/train.sbatch)
and the experiment configs (configs/*.yaml) at run time. They stay at the clone's top level, where a reader
finds them and an editable install reads them; a wheel (`pip install .`, `pip wheel .`, `pip install git+URL`)
gets copies under app/resources/, which app/core/shipped.py finds with importlib.resources.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# Each shipped folder and the files of it the wheel takes.
SHIPPED = {"configs": ["*.yaml"], "jobs": ["train.sbatch", "clusters/*.yaml"]}


class BuildPy(build_py):
    """setuptools' build_py, from an empty build/lib/app, then the shipped folders copied in."""

    def run(self) -> None:
        # setuptools keeps what an earlier build left in build/lib: a module or profile deleted since would
        # still be in the wheel.
        shutil.rmtree(Path(self.build_lib) / "app", ignore_errors=True)
        super().run()
        if self.editable_mode:
            return  # an editable install reads the clone's own folders
        for folder, patterns in SHIPPED.items():
            for pattern in patterns:
                found = sorted((HERE / folder).glob(pattern))
                if not found:
                    raise SystemExit(f"setup.py: no {folder}/{pattern} in {HERE}: build from a whole clone")
                for path in found:
                    target = Path(self.build_lib) / "app" / "resources" / path.relative_to(HERE)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, target)


setup(cmdclass={"build_py": BuildPy})
