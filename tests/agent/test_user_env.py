"""A user's own env, named ``module.path:EnvName-v0`` (Gymnasium's form), on every ``trace-gym`` command.

The env module is a real file in a temporary directory: ``trace-gym`` imports it from the current
directory (a console script's ``sys.path`` does not hold it), trains on it, and refuses a run directory
whose ``config.yaml`` names it on ``--resume`` unless the caller names or allows it: a run directory never
runs code.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest

from tests.agent.test_trainer import ROOT
from trace_agent.cli import main
from trace_agent.config import TrainConfig
from trace_agent.config_io import load_config, save_config
from trace_agent.env_factory import check_env_id, env_class, split_env_id, split_kwargs, task_ids
from trace_agent.errors import ConfigError, EnvSetupError

#: A user's env module: importing it registers ``usertest/Guess-v0`` and touches ``$MARKER`` when set.
MODULE = '''
import os
from pathlib import Path

import gymnasium as gym

from trace_envs import BranchableEnv, Task, TaskSet, TurnResult, parse_action

if os.environ.get("USER_ENV_MARKER"):
    Path(os.environ["USER_ENV_MARKER"]).write_text("imported")


class GuessEnv(BranchableEnv):
    """Guess a number from 1 to 8: answer <answer>n</answer>; reward 1 when right."""

    env_id = "usertest/Guess-v0"
    splits = ("train", "test")

    def __init__(self, *, tasks="train", max_turns=2, **kwargs):
        numbers = [n for n in range(1, 9) if (n % 4 == 0) == (tasks == "test")]
        task_set = TaskSet([Task(f"{tasks}-{n}", "Find the number from 1 to 8: <answer>n</answer>.", {"n": n})
                            for n in numbers], name=f"guess-{tasks}")
        super().__init__(tasks=task_set, max_turns=max_turns, **kwargs)

    def _start_episode(self, task):
        return task.prompt

    def _run_turn(self, action):
        parsed = parse_action(action)
        if not parsed.ok or parsed.answer is None:
            return TurnResult("answer with <answer>n</answer>")
        right = parsed.answer.strip() == str(self.task.data["n"])
        return TurnResult("right" if right else "wrong", reward=float(right), terminated=True, role="user")

    def _capture_state(self):
        return None

    def _restore_state(self, payload):
        pass


if "usertest/Guess-v0" not in gym.registry:
    gym.register(id="usertest/Guess-v0", entry_point=GuessEnv, order_enforce=False, disable_env_checker=True)
'''

ENV_ID = "guess_user_env:usertest/Guess-v0"

#: ``trace-gym`` as pip installs it: a script whose own directory, not the current one, heads ``sys.path``.
LAUNCHER = "import sys\nfrom trace_agent.cli import main\nsys.exit(main())\n"

_TINY = ["--policy", "tiny", "--steps", "1", "--no-eval", "--no-progress", "--set", "rollout.roots=2",
         "--set", "rollout.prompts_per_step=2", "--set", "rollout.group_size=2", "--set", "sampling.max_new_tokens=4",
         "--set", "sampling.max_turns=1", "--set", "predictor.kind=hashed", "--set", "log.tensorboard=false",
         "--set", "log.wandb=false"]


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch):
    """A directory holding ``guess_user_env.py`` (the user's module); the test runs there, nothing imported yet."""
    (tmp_path / "guess_user_env.py").write_text(MODULE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TRACE_GYM_ALLOW_CODE", raising=False)
    monkeypatch.setenv("USER_ENV_MARKER", str(tmp_path / "imported"))
    path = list(sys.path)
    yield tmp_path
    sys.path[:] = path
    sys.modules.pop("guess_user_env", None)
    gym.registry.pop("usertest/Guess-v0", None)


def _trace_gym(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    launcher = cwd / "bin" / "trace-gym"
    launcher.parent.mkdir(exist_ok=True)
    launcher.write_text(LAUNCHER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(launcher), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def test_trace_gym_trains_a_user_env_named_by_its_module(user_dir: Path) -> None:
    proc = _trace_gym(["train", "--env", ENV_ID, "--out", "run", *_TINY], user_dir)
    assert proc.returncode == 0, proc.stderr
    assert (user_dir / "run" / "trees" / "step_000001.jsonl").is_file() and (user_dir / "run" / "policy").is_dir()
    assert load_config(user_dir / "run" / "config.yaml").env_id == ENV_ID  # the run says which code it ran
    # the saved run names code: its resume is refused, before the module is imported ...
    (user_dir / "imported").unlink()
    proc = _trace_gym(["train", "--resume", "run", "--no-eval"], user_dir)
    assert proc.returncode == 1 and proc.stderr.count("\n") == 1, proc.stderr
    assert "names code to import" in proc.stderr and f"TRACE_GYM_ALLOW_CODE={ENV_ID}" in proc.stderr
    assert not (user_dir / "imported").exists()
    # ... unless the command line names the same env itself
    proc = _trace_gym(["train", "--resume", "run", "--env", ENV_ID, "--no-eval", "--no-progress"], user_dir)
    assert proc.returncode == 0, proc.stderr
    assert (user_dir / "imported").exists()


def test_env_factory_accepts_the_module_form(user_dir: Path) -> None:
    assert split_env_id(ENV_ID) == ("guess_user_env", "usertest/Guess-v0")
    assert split_env_id("trace_envs/PythonMath-v0") == (None, "trace_envs/PythonMath-v0")
    assert "guess_user_env" not in sys.modules
    check_env_id(ENV_ID)  # imports the module from the current directory
    assert (user_dir / "imported").read_text() == "imported"
    assert env_class(ENV_ID).__name__ == "GuessEnv"
    assert split_kwargs(ENV_ID, "test") == {"tasks": "test"}
    assert task_ids(ENV_ID, "test") == ["test-4", "test-8"]
    assert task_ids(ENV_ID, "train") == ["train-1", "train-2", "train-3", "train-5", "train-6", "train-7"]


@pytest.mark.parametrize("command", ["train", "eval", "bench"])
def test_an_unknown_module_is_a_one_line_error_naming_it(user_dir: Path, command: str, capsys) -> None:
    assert main([command, "--env", "no_such_user_module.envs:Guess-v0", "--policy", "tiny"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("trace-gym: error: ")
    assert "no module named 'no_such_user_module'" in err and str(user_dir) in err


def test_preflight_names_the_unknown_module(user_dir: Path, capsys) -> None:
    assert main(["train", "--env", "no_such_user_module:Guess-v0", "--policy", "tiny", "--preflight"]) == 1
    assert "no module named 'no_such_user_module'" in capsys.readouterr().out


@pytest.mark.parametrize(("env_id", "says"), [
    ("guess_user_env:usertest/Other-v0", "importing 'guess_user_env' registered no env 'usertest/Other-v0'"),
    ("json:Guess-v0", "importing 'json' registered no env 'Guess-v0'"),
    ("./guess_user_env.py:usertest/Guess-v0", "neither a registered id nor module.path:EnvName-v0"),
    ("guess_user_env:", "neither a registered id nor module.path:EnvName-v0"),
    ("a:b:Guess-v0", "neither a registered id nor module.path:EnvName-v0"),
    ("usertest/Guess-v0", "an env of your own: module.path:EnvName-v0"),
])
def test_a_wrong_env_id_says_what_is_wrong(user_dir: Path, env_id: str, says: str) -> None:
    with pytest.raises(EnvSetupError) as caught:
        check_env_id(env_id)
    assert says in str(caught.value)


def test_a_failing_import_inside_the_module_names_it(user_dir: Path) -> None:
    (user_dir / "broken_user_env.py").write_text("import no_such_dependency_of_mine\n")
    with pytest.raises(EnvSetupError, match="importing 'broken_user_env' failed: No module named "
                                            "'no_such_dependency_of_mine'"):
        check_env_id("broken_user_env:Guess-v0")
    sys.modules.pop("broken_user_env", None)


@pytest.mark.hostile
def test_a_run_dir_naming_an_env_module_is_refused_unless_allowed(user_dir: Path, monkeypatch, capsys) -> None:
    from trace_agent.rundir import resume_config

    run = user_dir / "forged"
    run.mkdir()
    save_config(TrainConfig(env_id=ENV_ID, out_dir=str(run)), run / "config.yaml")  # as a forger would write it
    for argv in (["train", "--resume", str(run), "--no-eval"], ["train", "--resume", str(run), "--steps", "3"]):
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"env_id: {ENV_ID}" in err and f"TRACE_GYM_ALLOW_CODE={ENV_ID}" in err
    with pytest.raises(ConfigError, match="names code to import"):
        resume_config(run)
    assert not (user_dir / "imported").exists() and "guess_user_env" not in sys.modules  # nothing ran
    assert resume_config(run, allow_code=(ENV_ID,)).env_id == ENV_ID
    monkeypatch.setenv("TRACE_GYM_ALLOW_CODE", f"other.mod:Thing,{ENV_ID}")
    assert resume_config(run).env_id == ENV_ID
    assert not (user_dir / "imported").exists() and "guess_user_env" not in sys.modules  # allowing is not running


STRATEGY = "guess_user_env:GuessEnv"


@pytest.mark.hostile
@pytest.mark.parametrize(("flag", "spec", "unnamed"), [("--env", ENV_ID, "rollout.strategy"),
                                                       ("--strategy", STRATEGY, "env_id")])
def test_code_named_beside_resume_is_allowed_and_nothing_else(user_dir: Path, flag: str, spec: str,
                                                              unnamed: str) -> None:
    from trace_agent.cli import build_parser
    from trace_agent.config import RolloutSettings
    from trace_agent.train_cli import config_from_args

    run = user_dir / "run"
    run.mkdir()
    save_config(TrainConfig(env_id=ENV_ID, rollout=RolloutSettings(strategy=STRATEGY)), run / "config.yaml")
    parser = build_parser()
    with pytest.raises(ConfigError, match=rf"names code to import \({unnamed}: "):  # the one the caller left out
        config_from_args(parser.parse_args(["train", "--resume", str(run), flag, spec]))
    both = config_from_args(parser.parse_args(["train", "--resume", str(run), "--env", ENV_ID,
                                               "--strategy", STRATEGY]))
    assert (both.env_id, both.rollout.strategy) == (ENV_ID, STRATEGY)
    assert "guess_user_env" not in sys.modules  # naming is allowing, not running
