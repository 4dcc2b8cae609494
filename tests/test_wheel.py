"""The wheel works alone: built with ``pip wheel --no-deps``, installed into fresh venvs, run from a
directory outside the source tree.

* ``base``: the wheel with its declared dependencies only (from the package index): ``--version``,
  the packaged demo configs, WikiQA-v0's default retriever (bm25s is a base dependency), and a
  ``--preflight`` that names every missing import of a training run (torch ...) instead of passing.
* ``full``: the wheel (``--no-deps``) over the shared venv's dependencies (a ``.pth`` line to its
  site-packages, which does not load that venv's editable trace-gym): ``trace-gym train --steps 1``
  with the demo settings trains at the demo config's learning rate, not the library default.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def _run(args: list[str], *, cwd: Path, timeout: float = 900, check: bool = True,
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    clean.update(env or {})
    out = subprocess.run(args, cwd=cwd, env=clean, capture_output=True, text=True, timeout=timeout)
    if check and out.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {out.returncode}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return out


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheels")
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(ROOT)],
         cwd=out)
    (built,) = out.glob("trace_gym-*.whl")
    return built


def _venv(where: Path) -> Path:
    _run([sys.executable, "-m", "venv", str(where)], cwd=where.parent)
    return where / "bin"


def test_the_wheel_carries_the_package_data(wheel: Path) -> None:
    import zipfile

    names = set(zipfile.ZipFile(wheel).namelist())
    for package in ("trace_envs", "trace_agent", "retrievers"):
        assert f"{package}/py.typed" in names
    assert {"trace_agent/configs/demo.yaml", "trace_agent/configs/wiki_demo.yaml",
            "trace_agent/configs/bfcl_demo.yaml"} <= names
    assert any(n.endswith("dist-info/licenses/LICENSE") for n in names)
    license_text = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("licenses/LICENSE"))).decode()
    assert "Apache License" in license_text and "Version 2.0, January 2004" in license_text


def test_a_base_install_runs_and_its_preflight_names_the_missing_imports(wheel: Path, tmp_path: Path) -> None:
    bin_dir = _venv(tmp_path / "venv")
    _run([str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)], cwd=tmp_path, timeout=1200)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    version = _run([str(bin_dir / "trace-gym"), "--version"], cwd=outside).stdout.strip()
    assert version == "trace-gym 0.1.0"
    probe = ("import trace_agent, trace_envs, gymnasium as gym\n"
             "from trace_agent.config_io import CONFIG_DIR\n"
             "print(trace_agent.__version__, trace_agent.__file__)\n"
             "print((CONFIG_DIR / 'demo.yaml').is_file())\n"
             "env = gym.make('trace_envs/WikiQA-v0')\n"
             "print(type(env.unwrapped.retriever).__name__)\n")
    lines = _run([str(bin_dir / "python"), "-c", probe], cwd=outside,
                 env={"TRACE_GYM_CACHE": str(tmp_path / "cache")}).stdout.splitlines()
    assert lines[0].startswith("0.1.0 " + str(tmp_path / "venv")), lines
    assert lines[1:] == ["True", "BM25Retriever"]
    checked = _run([str(bin_dir / "trace-gym"), "train", "--preflight", "--out", "run"], cwd=outside, check=False)
    assert checked.returncode != 0
    assert "FAIL  this run imports torch, which this Python lacks: pip install 'trace-gym[agent]'" in checked.stdout
    failed = _run([str(bin_dir / "trace-gym"), "train", "--steps", "1", "--out", "run"], cwd=outside, check=False)
    assert failed.returncode == 1 and "this run imports torch" in failed.stderr
    assert "Traceback" not in failed.stderr


@pytest.fixture()
def open_dir() -> Iterator[Path]:
    """A directory other uids can read: the PythonMath sandbox runs the venv's interpreter as its own uid
    (pytest's tmp_path lies under a directory only its owner may enter)."""
    path = Path(tempfile.mkdtemp(prefix="trace-gym-wheel-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_train_from_outside_the_source_tree_uses_the_demo_settings(wheel: Path, open_dir: Path) -> None:
    tmp_path = open_dir
    bin_dir = _venv(tmp_path / "venv")
    site = Path(_run([str(bin_dir / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp_path).stdout.strip())
    # the shared venv's dependencies; a .pth line adds a path, it does not run that dir's editable-install hooks
    (site / "_shared_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)], cwd=tmp_path)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    where = _run([str(bin_dir / "python"), "-c", "import trace_agent; print(trace_agent.__file__)"], cwd=outside)
    assert where.stdout.startswith(str(site)), "the wheel's trace_agent, not a checkout's"
    demo = yaml.safe_load((ROOT / "trace_agent" / "configs" / "demo.yaml").read_text())
    run = _run([str(bin_dir / "trace-gym"), "train", "--steps", "1", "--out", "run", "--no-progress",
                "--set", "eval.tasks=2", "--set", "eval.samples=1", "--set", "rollout.prompts_per_step=4",
                "--set", "rollout.roots=8"], cwd=outside,
               env={"HF_HUB_OFFLINE": "1", "TRACE_GYM_CACHE": str(tmp_path / "cache")})
    assert "using the demo policy's settings for trace_envs/PythonMath-v0" in run.stderr
    config = yaml.safe_load((outside / "run" / "config.yaml").read_text())
    assert config["optim"]["lr"] == demo["optim"]["lr"] == 3e-4
    assert config["sampling"]["max_turns"] == demo["sampling"]["max_turns"]
    assert (outside / "run" / "policy" / "config.json").is_file()
