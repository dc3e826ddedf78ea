"""The images and the pins they share: what can be checked without a Docker engine.

Docker's own parser reads each Dockerfile; every file it copies exists; the base image and every
version it names agree with constraints.txt; the pins cover every dependency the project declares;
and this environment (installed with ``-c constraints.txt``, as CI and the images do) holds
exactly the pinned versions.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from importlib import metadata
from pathlib import Path

import dockerfile
import pytest

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("gpu", "cpu")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version and " " not in line, f"constraints.txt: '{line}' is not name==version"
            assert _norm(name) not in pins, f"constraints.txt pins {name} twice"
            pins[_norm(name)] = version
    return pins


def _bases() -> dict[str, str]:
    text = (ROOT / "constraints.txt").read_text()
    return dict(re.findall(r"^# image (\w+)-base (\S+)$", text, re.M))


@pytest.mark.parametrize("kind", KINDS, ids=[f"{k}-image" for k in KINDS])
def test_dockerfile_parses_and_agrees_with_the_pins(kind):
    commands = dockerfile.parse_file(str(ROOT / "docker" / f"{kind}.Dockerfile"))
    by = lambda cmd: [c for c in commands if c.cmd == cmd]  # noqa: E731
    args = dict(a.value[0].split("=", 1) for a in by("ARG") if "=" in a.value[0])
    assert [f.value[0] for f in by("FROM")] == ["${BASE_IMAGE}"]
    assert args["BASE_IMAGE"] == _bases()[kind]  # the default and docker/build.sh's argument agree
    for copy in by("COPY"):
        for src in copy.value[:-1]:
            assert (ROOT / src).exists(), f"{kind}.Dockerfile copies {src}, which is not in the tree"
    pins = _pins()
    for run in by("RUN"):
        for name, version in re.findall(r"([A-Za-z0-9_.-]+)(?:\[[^\]]*\])?==([0-9][0-9A-Za-z.+-]*)", run.value[0]):
            assert pins.get(_norm(name)) == version, f"{kind}.Dockerfile installs {name}=={version}"
    env = dict(zip(*[iter(next(c for c in by("ENV")).value)] * 2, strict=True))
    assert env["PIP_CONSTRAINT"].endswith("/constraints.txt")  # every pip call in the image is pinned


def test_every_declared_dependency_is_pinned():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + [d for extra in project["optional-dependencies"].values() for d in extra]
    pins = _pins()
    missing = [d for d in declared if _norm(re.match(r"[A-Za-z0-9_.-]+", d).group()) not in pins]
    assert not missing, f"not in constraints.txt (run tools/update_pins.sh): {missing}"


def test_this_environment_is_the_pinned_one():
    installed: dict[str, str] = {}
    for dist in metadata.distributions():  # in sys.path order: the first of a name is what an import finds
        if "_vendor" in Path(str(dist.locate_file(""))).parts:
            continue  # setuptools' private copies, which it puts on sys.path once imported
        installed.setdefault(_norm(dist.metadata["Name"]), dist.version)
    off = {}
    for name, pinned in _pins().items():  # the GPU image's packages are not in this environment
        if name in installed and installed[name].split("+")[0] != pinned:
            off[name] = (installed[name], pinned)
    assert not off, f"installed (version, pinned): {off}; install with -c constraints.txt"


def test_build_script_refuses_an_unknown_image_kind():
    res = subprocess.run(["bash", str(ROOT / "docker" / "build.sh"), "tpu"], capture_output=True, text=True)
    assert res.returncode == 2 and "gpu or cpu" in res.stderr


def test_the_gpu_image_bounds_the_transformer_engine_build_and_loads_its_extension():
    """The TE step: ninja's jobs bounded (a build argument a large builder raises; ~2.9 GB a compile),
    the venv's cuDNN and NCCL headers ahead of the base's, CUDNN_PATH set for good (TE's loader looks
    there before the system's libcudnn.so), and a check that imports the compiled extension itself after
    torch and transformer_engine (it registers under the package; the package imports with a broken one)."""
    commands = dockerfile.parse_file(str(ROOT / "docker" / "gpu.Dockerfile"))
    args = dict(c.value[0].split("=", 1) for c in commands if c.cmd == "ARG" and "=" in c.value[0])
    assert int(args["MAX_JOBS"]) >= 1
    env = {}
    for c in commands:
        if c.cmd == "ENV":
            env.update(zip(*[iter(c.value)] * 2, strict=True))
    assert env["CUDNN_PATH"] == "/opt/venv/lib/python3.12/site-packages/nvidia/cudnn"
    runs = [c.value[0] for c in commands if c.cmd == "RUN"]
    (te,) = [r for r in runs if "transformer-engine[pytorch]" in r]
    assert "MAX_JOBS=${MAX_JOBS}" in te and 'CPATH="${CUDNN_PATH}/include:' in te and "nvidia/nccl/include" in te
    later = runs[runs.index(te) + 1 :]
    assert any('python -c "import torch, transformer_engine.pytorch, transformer_engine_torch"' in r for r in later)
