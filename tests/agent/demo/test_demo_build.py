"""The demo-policy build loop checkpoints and resumes: stopped mid-way and restarted, it ends with the same weights;
every shipped demo policy was built with its env's preset."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from trace_agent.demo import build as demo_build
from trace_agent.demo import model as demo_model
from trace_agent.demo import shipped as demo_shipped
from trace_agent.demo.build import DemoTrainConfig, demo_train_config
from trace_agent.demo.model import DemoModelConfig, make_demo_model, tiny_policy
from trace_agent.demo.shipped import SHIPPED_DEMO_POLICIES
from trace_agent.errors import ConfigError

_MODEL = DemoModelConfig(vocab_size=400, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16,
                         intermediate_size=64)


def _data(tokenizer) -> list[tuple[list[int], list[bool]]]:
    rng = np.random.default_rng(0)
    prefix = rng.integers(5, 300, 12).tolist()
    out = []
    for _ in range(6):
        n = int(rng.integers(6, 14))
        out.append((prefix + rng.integers(5, 300, n).tolist(), [False] * len(prefix) + [True] * n))
    return out


class _Stop(Exception):
    pass


def _train(tmp: Path | None, steps: int, monkeypatch=None, stop_after: int | None = None):
    tokenizer = tiny_policy().tokenizer
    model = make_demo_model(tokenizer, _MODEL, seed=0)
    cfg = DemoTrainConfig(steps=steps, batch_size=3, warmup_steps=2, model=_MODEL)
    if stop_after is not None:
        calls = {"n": 0}
        real = torch.nn.utils.clip_grad_norm_

        def clip(*a, **k):
            calls["n"] += 1
            if calls["n"] > stop_after:
                raise _Stop
            return real(*a, **k)

        monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
    logs: list[str] = []
    losses = demo_build._train(model, _data(tokenizer), cfg, pad_id=0, log=logs.append, checkpoint_dir=tmp,
                         checkpoint_every=2)
    return model, losses, logs


def test_a_stopped_build_resumes_to_the_same_weights(tmp_path: Path, monkeypatch) -> None:
    straight, losses, _ = _train(None, 7)
    with pytest.raises(_Stop):
        _train(tmp_path / "ckpt", 7, monkeypatch, stop_after=5)  # checkpoints after steps 2 and 4
    monkeypatch.undo()
    assert (tmp_path / "ckpt" / "manifest.json").exists()
    resumed, resumed_losses, logs = _train(tmp_path / "ckpt", 7)
    assert any("resuming the demo-policy build at step 4/7" in m for m in logs)
    assert resumed_losses == losses
    assert all(torch.equal(a, b) for a, b in zip(straight.state_dict().values(), resumed.state_dict().values()))


def test_a_checkpoint_of_other_settings_is_not_resumed(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(_Stop):
        _train(tmp_path / "ckpt", 7, monkeypatch, stop_after=3)
    monkeypatch.undo()
    _, losses, logs = _train(tmp_path / "ckpt", 5)  # other settings: starts over
    assert any("starting over" in m for m in logs) and len(losses) == 5


def test_first_turn_cuts_after_the_first_assistant_turn() -> None:
    ids = list(range(12))
    mask = [False] * 3 + [True] * 3 + [False] * 2 + [True] * 4  # prompt, turn 1, observation, turn 2
    assert demo_build.first_turn(ids, mask) == (ids[:6], mask[:6])
    assert demo_build.first_turn(ids[:6], mask[:6]) == (ids[:6], mask[:6])  # a one-turn episode is its first turn
    for seq, m in _data(tiny_policy().tokenizer):
        cut, cut_mask = demo_build.first_turn(seq, m)
        assert cut == seq[:len(cut)] and cut_mask[-1] and sum(cut_mask) == len(cut_mask) - cut_mask.index(True)


def _json(value):
    return json.loads(json.dumps(value))


@pytest.mark.parametrize("env_id", sorted(SHIPPED_DEMO_POLICIES))
def test_every_shipped_policy_was_built_with_its_env_preset(env_id: str) -> None:
    """``scripts/build_demo_policy.py --env ENV`` rebuilds what is shipped: the settings a shipped build recorded in
    its ``build_report.json`` are the env's preset (``demo_train_config``), field for field. A field the report
    lacks was added to ``DemoTrainConfig`` after that build, and the preset must hold its default there (the
    behaviour the build had)."""
    report = SHIPPED_DEMO_POLICIES[env_id] / "build_report.json"
    if not report.is_file():
        pytest.skip(f"{env_id}: no shipped demo policy")
    recorded = json.loads(report.read_text())["config"]
    preset = _json(asdict(demo_train_config(env_id, seed=recorded["seed"])))
    defaults = _json(asdict(DemoTrainConfig()))
    _assert_recorded(preset["model"], recorded.pop("model"), defaults["model"])
    _assert_recorded(preset, recorded, defaults)


def _assert_recorded(preset: dict, recorded: dict, defaults: dict) -> None:
    assert {k: preset.get(k) for k in recorded} == recorded
    assert {k: preset[k] for k in preset.keys() - recorded.keys() - {"model"}} == \
        {k: defaults[k] for k in preset.keys() - recorded.keys() - {"model"}}


# --------------------------------------------------------------------------- the tokenizer's split
_CORPUS = ["Move the file to the archive folder, then list the folder.",
           "[mv(source='notes.txt', destination='archive'), ls()]", "cd(folder='documents')"] * 4
#: names none of the corpus holds: they are spelled from bytes and the few merges the corpus gave
_NAMES = ["analysis_report.csv", "Velmorath", "qz_kx9.bin", "San Francisco", "x"]


def _name_ids(tokenizer, text: str, name: str) -> list[int] | None:
    """The ids of the tokens that spell ``name`` inside ``text`` (None: a token straddles its edge)."""
    start = text.index(name)
    end = start + len(name)
    enc = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    ids = []
    for tid, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]):
        if start <= a and b <= end:
            ids.append(tid)
        elif a < end and b > start:
            return None
    return ids


@pytest.mark.parametrize("name", _NAMES)
def test_the_copy_split_spells_a_name_alike_in_prose_and_in_calls(name: str) -> None:
    """Under ``split="copy"`` a name the user writes in running text is the very tokens it is in a call, quoted,
    after ``='`` or in a list, so a policy can copy it; under Qwen's split a space glues to its first word."""
    contexts = [f"Please move {name} to the archive.", f"[mv(source='{name}', destination='archive')]",
                f"[cat(file_name=['a', '{name}'])]", f'Then open "{name}".', f"Open '{name}' now"]
    copy = demo_model.train_demo_tokenizer(_CORPUS, vocab_size=400, split="copy")
    spelled = [_name_ids(copy, text, name) for text in contexts]
    assert spelled[0] is not None and all(s == spelled[0] for s in spelled)
    # Qwen's pre-tokenizer glues the space before it to the name's first word (it becomes " analysis")
    qwen = demo_model.train_demo_tokenizer(_CORPUS, vocab_size=400, split="qwen")
    start = contexts[0].index(name)
    pieces = qwen.backend_tokenizer.pre_tokenizer.pre_tokenize_str(contexts[0])
    assert any(a == start - 1 and b > start for _, (a, b) in pieces)
    pieces = copy.backend_tokenizer.pre_tokenizer.pre_tokenize_str(contexts[0])
    assert start in {a for _, (a, _) in pieces}


def test_the_copy_split_is_lossless_on_hostile_text() -> None:
    copy = demo_model.train_demo_tokenizer(_CORPUS, vocab_size=400, split="copy")
    for text in ["", "  two  spaces\tand a tab\n\nnewlines\r\n", "naïve café — 名前 \u200b zero-width",
                 "it's the user's 'quoted' name", "\x00\x01 control bytes", "emoji 🙂 and ''' quotes"]:
        assert copy.decode(copy(text, add_special_tokens=False)["input_ids"]) == text


def test_an_unknown_split_is_refused() -> None:
    with pytest.raises(ValueError, match="split"):
        DemoModelConfig(split="bpe")
    with pytest.raises(ValueError, match="split"):
        demo_model.train_demo_tokenizer(_CORPUS, vocab_size=400, split="bpe")


# --------------------------------------------------------------------------- --set settings
def test_settings_change_the_preset_field_by_field() -> None:
    preset = demo_train_config("trace_envs/BFCL-v0")
    changed = demo_build.with_settings(preset, [
        "augment_copies=2", "model.split = copy", "first_turn_steps = 10", "env_ids=[\"trace_envs/BFCL-v0\"]",
        'demonstrator_options={"trace_envs/BFCL-v0": {"num_tasks": null}}'])
    assert changed.augment_copies == 2 and changed.first_turn_steps == 10 and changed.model.split == "copy"
    assert changed.env_ids == ("trace_envs/BFCL-v0",)
    assert changed.demonstrator_options == {"trace_envs/BFCL-v0": {"num_tasks": None}}
    assert demo_build.with_settings(preset, []) == preset
    # everything not set is the preset's, the model's other fields included
    assert demo_build.with_settings(changed, ["augment_copies=0", "model.split=qwen", "first_turn_steps=300",
                                        "demonstrator_options={}"]) == preset


@pytest.mark.parametrize("setting, error", [
    ("nope=1", "unknown DemoTrainConfig field.*'nope'"), ("model.width=3", "unknown DemoModelConfig field.*'width'"),
    ("model=3", "model=3: expected a mapping"), ("steps", "field=value"), ("=3", "field=value"),
    ("model.split=bpe", "split"), ("flawed_fraction=2", "flawed_fraction"),
])
def test_a_bad_setting_is_a_value_error_naming_it(setting: str, error: str) -> None:
    with pytest.raises(ValueError, match=error):
        demo_build.with_settings(demo_train_config(), [setting])


@pytest.mark.parametrize("setting", [
    "steps=1.5", "steps=true", "learning_rate=false", "demonstrator_options=[]", "model.num_layers=null",
    "steps=[1]", "model.hidden_size={}",
])
def test_a_setting_of_the_wrong_type_is_a_config_error_naming_it(setting: str) -> None:
    key = setting.partition("=")[0]
    with pytest.raises(ConfigError, match=re.escape(key + "=")):
        demo_build.with_settings(demo_train_config(), [setting])


def test_settings_convert_as_train_set_does() -> None:
    """One ``--set`` syntax for every command: the demo build converts values as ``trace-gym train --set``."""
    from trace_agent.config import OptimConfig
    from trace_agent.config_io import apply_overrides, config_from_dict

    preset = demo_train_config()
    assert demo_build.with_settings(preset, ['steps="12"']).steps == 12
    assert config_from_dict(OptimConfig, apply_overrides({}, ['minibatches="12"'])).minibatches == 12
    assert demo_build.with_settings(preset, ["tasks_per_env=2.0"]).tasks_per_env == 2
    assert demo_build.with_settings(preset, ["env_ids=trace_envs/BFCL-v0"]).env_ids == ("trace_envs/BFCL-v0",)


def test_every_field_takes_its_own_value_back_as_a_setting() -> None:
    """Each settable field's preset value, written as JSON, is accepted with its type (an int for a float field
    becomes a float; ``null`` for an optional one): no field is left unsettable by the type check."""
    preset = demo_train_config("trace_envs/BFCL-v0", tasks_per_env=3)
    settings = [f"{name}={json.dumps(getattr(preset, name))}" for name in preset.__dataclass_fields__ if name != "model"]
    settings += [f"model.{name}={json.dumps(getattr(preset.model, name))}" for name in preset.model.__dataclass_fields__]
    assert demo_build.with_settings(demo_train_config("trace_envs/BFCL-v0"), settings) == preset
    assert demo_build.with_settings(preset, ["tasks_per_env=null"]).tasks_per_env is None
    assert demo_build.with_settings(preset, ["learning_rate=1"]).learning_rate == 1.0


def test_a_setting_is_read_as_data_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    with pytest.raises(ConfigError, match="steps="):  # read as a string, which is not an integer
        demo_build.with_settings(demo_train_config(), [f"steps={code}"])
    with pytest.raises(ValueError, match="split"):
        demo_build.with_settings(demo_train_config(), [f"model.split={code}"])
    assert not marker.exists()


def _build_script(*argv: str) -> subprocess.CompletedProcess:
    """``scripts/build_demo_policy.py ARGV`` as a user runs it."""
    script = Path(__file__).resolve().parents[3] / "scripts" / "build_demo_policy.py"
    return subprocess.run([sys.executable, str(script), *argv], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_the_build_script_applies_and_records_its_settings(tmp_path: Path) -> None:
    """``build_demo_policy.py --set`` reaches the build: the report records it and the saved tokenizer splits
    as it says; a bad setting stops the script before anything is built."""
    small = ["steps=2", "batch_size=2", "warmup_steps=1", "tasks_per_env=2", "demos_per_task=1",
             "model.vocab_size=400", "model.hidden_size=32", "model.num_layers=1", "model.num_heads=2",
             "model.num_kv_heads=1", "model.head_dim=16", "model.intermediate_size=64", "model.split=copy"]
    argv = ["--out", str(tmp_path / "p"), "--env", "trace_envs/PythonMath-v0"]
    proc = _build_script(*argv, *(a for s in small for a in ("--set", s)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    config = json.loads((tmp_path / "p" / "build_report.json").read_text())["config"]
    assert config["steps"] == 2 and config["tasks_per_env"] == 2 and config["model"]["split"] == "copy"
    policy = demo_shipped.load_demo_policy(tmp_path / "p")
    pieces = policy.tokenizer.backend_tokenizer.pre_tokenizer.pre_tokenize_str("move notes.txt")
    assert [p for p, _ in pieces][:3] == ["move", "Ġ", "notes"]
    stop = _build_script("--out", str(tmp_path / "q"), "--set", "model.width=3")
    assert stop.returncode == 2 and not (tmp_path / "q").exists()
