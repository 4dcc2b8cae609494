"""Fuzzing every registered env with 10,000+ random and mutated actions: no exception, bounded time per step.

Actions are drawn from a seeded generator: random Unicode (lone surrogates and control characters
included), oversized turns, deep nesting, thousands of unclosed openers, and mutations (insertions,
deletions, duplications, huge numbers, re-nesting) of each env's own valid actions. For PythonMath most
actions never reach the interpreter (they are malformed); a few hundred run real cells. Snapshots and
restores are interleaved so the fuzzed state is branched too.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Iterator

import gymnasium as gym
import pytest

import trace_envs
from trace_envs.actions import parse_action
from trace_envs.python_tool.sandbox import SandboxConfig

pytestmark = pytest.mark.hostile

STEPS = 10_000
MALFORMED_STEP_S = 1.0  # a malformed turn never takes longer than this, even on a loaded machine

PIECES = ["<tool_call>", "</tool_call>", "<answer>", "</answer>", "<think>", "</think>", "\\boxed{", "{", "}",
          "[", "]", "(", ")", '"', "\\", ":", ",", "name", "arguments", "code", "query", "```", "\n", "\ud800",
          "\udfff", "\x00", "\u202e", "9" * 40, "é", "😀"]
CELLS = ["1 + 1", "x = 3\nx * 2", "print('a' * 50)", "import math\nmath.factorial(30)", "def (", "1/0",
         "[i * i for i in range(100)][-1]", "open('f.txt', 'w').write('hi')", "'\\ud800'", "import os\nos.getcwd()",
         "raise SystemExit(2)", "while False: pass", "sum(range(10**5))", "import sympy\nsympy.Symbol('z') ** 2"]


def _random_text(rng: random.Random, n: int) -> str:
    kind = rng.random()
    if kind < 0.4:
        return "".join(rng.choice(PIECES) for _ in range(n // 4 + 1))
    if kind < 0.7:
        return "".join(chr(rng.randrange(0x20, 0x7F)) for _ in range(n))
    return "".join(chr(rng.randrange(0, 0x110000)) for _ in range(n))  # surrogates and unassigned included


def _mutate(rng: random.Random, text: str) -> str:
    for _ in range(rng.randint(1, 4)):
        op = rng.randrange(7)
        i = rng.randrange(len(text) + 1)
        j = min(len(text), i + rng.randrange(1, 40))
        if op == 0:
            text = text[:i] + _random_text(rng, rng.randrange(1, 20)) + text[i:]
        elif op == 1:
            text = text[:i] + text[j:]
        elif op == 2:
            text = text[:i] + text[i:j] * rng.randrange(2, 50) + text[j:]
        elif op == 3:
            text = text[:i] + "9" * rng.choice([10, 400, 5000]) + text[i:]
        elif op == 4:
            depth = rng.choice([10, 100, 3000])
            text = text[:i] + "[" * depth + text[i:j] + "]" * rng.choice([0, depth]) + text[j:]
        elif op == 5:
            text = text[:i] + rng.choice(["\ud800", "\udcff", "\x00", "\ufeff"]) + text[i:]
        else:
            text = text.replace('"', "'", 1) if rng.random() < 0.5 else text[::-1]
    return text


def actions(rng: random.Random, valid: list[str], n: int, *, mutated: float = 0.5,
            unchanged: float = 0.1) -> Iterator[str]:
    """``n`` hostile actions: mutations of ``valid`` ones, random ones and unchanged valid ones, with rare giants."""
    for k in range(n):
        roll = rng.random()
        if k % 1000 == 999:
            yield rng.choice(["<tool_call>" * 20_000, "x" * 300_000, "[" * 120_000, "<think>" + "a" * 150_000])
        elif roll < mutated:
            yield _mutate(rng, rng.choice(valid))
        elif roll < 1.0 - unchanged:
            yield _random_text(rng, rng.choice([1, 10, 100, 1000]))
        else:
            yield rng.choice(valid)


def _python_call(code: str) -> str:
    return "<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>"


def _fuzz(env: gym.Env, valid: list[str], *, seed: int, n: int = STEPS, slow_step_s: float = MALFORMED_STEP_S,
          reaches_backend=lambda action: False, restore_every: int = 23, **mix: float) -> dict[str, int]:
    rng = random.Random(seed)
    unwrapped = env.unwrapped
    env.reset(seed=seed)
    stats = {"steps": 0, "resets": 1, "restores": 0, "backend": 0}
    snap = None
    for k, action in enumerate(actions(rng, valid, n, **mix)):
        if unwrapped.done:
            env.reset(seed=seed + k)
            stats["resets"] += 1
            snap = None
        start = time.monotonic()
        obs, reward, terminated, truncated, info = env.step(action)
        elapsed = time.monotonic() - start
        slow_ok = reaches_backend(action)
        stats["backend"] += bool(slow_ok)
        limit = slow_step_s if not slow_ok else 20.0
        assert elapsed < limit, f"step {k} took {elapsed:.2f} s on {action[:200]!r}"
        assert isinstance(obs, str) and isinstance(reward, float) and isinstance(info, dict)
        obs.encode("utf-8")
        stats["steps"] += 1
        if unwrapped.done:
            continue
        if snap is None and k % 5 == 0:
            snap = unwrapped.snapshot()
        elif snap is not None and k % restore_every == 0:
            unwrapped.restore(snap)
            stats["restores"] += 1
    json.dumps(unwrapped.messages, ensure_ascii=False).encode("utf-8")
    return stats


def test_fuzz_python_math():
    env = gym.make("trace_envs/PythonMath-v0", max_turns=40,
                   sandbox=SandboxConfig(timeout_s=2.0, kill_grace_s=1.0, cpu_s=2))
    try:
        valid = [_python_call(c) for c in CELLS] + ["<answer>\\boxed{42}</answer>", "thinking...",
                                                    "<think>plan</think>" + _python_call("2 ** 10")]
        # only ~3% of actions are unmutated valid calls: a few hundred real cells among 10,000 actions
        # cells run up to timeout_s + kill_grace_s; answers are graded within grade_answer's 3 s deadline
        def reaches(action: str) -> bool:
            parsed = parse_action(action, max_tool_calls=4)
            return parsed.ok and (parsed.answer is not None or any(c.name == "python" for c in parsed.tool_calls))

        stats = _fuzz(env, valid, seed=1, reaches_backend=reaches, restore_every=97, mutated=0.25, unchanged=0.03)
        assert stats["steps"] == STEPS and stats["restores"] > 5
        assert 100 < stats["backend"] < 2000, stats  # a few hundred actions ran real cells or were graded
        box = env.unwrapped._sandbox
        assert box is not None and box.process_count() <= 3 + len(box._frozen)
    finally:
        env.close()


def test_fuzz_wiki_qa(tmp_path, monkeypatch):
    monkeypatch.setenv("TRACE_GYM_CACHE", str(tmp_path))
    env = gym.make("trace_envs/WikiQA-v0", max_turns=30)
    try:
        valid = [trace_envs.actions.format_tool_call("search", {"query": q})
                 for q in ("river in france", "who wrote hamlet", "capital", "\ud800")]
        valid += ["<answer>Paris</answer>", '<tool_call>{"name": "search", "arguments": {"query": ""}}</tool_call>']
        stats = _fuzz(env, valid, seed=2)
        assert stats["steps"] == STEPS
    finally:
        env.close()


def test_fuzz_bfcl():
    pytest.importorskip("bfcl_eval")
    pytest.importorskip("mpmath")
    env = gym.make("trace_envs/BFCL-v0", category="multi_turn_base")
    try:
        valid = ["[ls(a=True)]", "[cd(folder='document')]", "[mkdir(dir_name='x')]", "[add(a=1, b=2)]",
                 '<tool_call>{"name": "ls", "arguments": {"a": true}}</tool_call>', "Done.", "[]",
                 "[power(base=10, exponent=300)]", "```python\n[pwd()]\n```", "[echo(content='hi', file_name='a')]"]
        stats = _fuzz(env, valid, seed=3, reaches_backend=lambda a: "power" in a or "logarithm" in a)
        assert stats["steps"] == STEPS
    finally:
        env.close()


def test_fuzzer_is_not_empty():
    """A guard on the sweep: every registered env is fuzzed above, and the generator yields hostile input."""
    assert set(trace_envs.registered_ids()) == {"trace_envs/PythonMath-v0", "trace_envs/WikiQA-v0",
                                                "trace_envs/BFCL-v0"}
    sample = list(actions(random.Random(0), ["<answer>1</answer>"], 2000))
    assert any(len(a) > 100_000 for a in sample)
    assert any("\ud800" <= ch <= "\udfff" for a in sample for ch in a)
    assert any(a.count("[") > 1000 for a in sample)
    assert os.cpu_count()


# File operations and processes, interleaved with snapshots: every branch must equal a straight replay.
FILE_OPS = [
    "open('a.txt', 'a').write('{n}')",
    "open('b.txt', 'w').write('{n}' * 3)",
    "os.makedirs('d/e', exist_ok=True); open('d/e/f.txt', 'a').write('{n}')",
    "os.path.lexists('la') or os.symlink(os.path.abspath('a.txt'), 'la'); open('la', 'a').write('L{n}')",
    "os.path.lexists('rb') or os.symlink('b.txt', 'rb'); os.path.exists('rb') and os.truncate('rb', {n} % 3)",
    "os.path.exists('a.txt') and not os.path.exists('h.txt') and os.link('a.txt', 'h.txt')",
    "os.path.exists('h.txt') and open('h.txt', 'a').write('H')",
    "os.path.exists('b.txt') and os.rename('b.txt', 'c.txt')",
    "os.path.exists('c.txt') and os.chmod('c.txt', 0o600 + {n} % 2 * 0o044)",
    "held.write('{n}'); held.flush()",
    "held.seek({n} % 4)",
    "reader.seek(0); reader.read({n} % 5)",
    "ro = os.open('.', os.O_RDONLY); fd = os.open('dirfd.txt', os.O_WRONLY | os.O_CREAT | os.O_APPEND, dir_fd=ro); "
    "os.write(fd, b'{n}'); os.close(fd); os.close(ro)",
    "os.path.exists('a.txt') and open(f'/proc/self/fd/{{(pf := open(\"a.txt\")).fileno()}}', 'a').write('P')",
    "os.path.exists('c.txt') and os.unlink('c.txt')",
    "import mmap; m = mmap.mmap(os.open('big.bin', os.O_RDWR), 8, flags=mmap.MAP_PRIVATE); m[:1] = b'M'",
    # what the filer must copy exactly: unreadable modes, a deep chain, FIFOs, renamed dirs
    "os.path.exists('a.txt') and os.chmod('a.txt', 0o200 if {n} % 2 else 0o640)",
    "os.path.isdir('d') and os.chmod('d', 0o500 if {n} % 2 else 0o700)",
    "q = '/'.join(['q'] * 40); os.makedirs(q, exist_ok=True); open(q + '/leaf', 'a').write('{n}'); "
    "print(open(q + '/leaf').read())",
    "os.path.lexists('fifo') or os.mkfifo('fifo', 0o600 + {n} % 2 * 0o040)",
    "os.path.isdir('d') and os.rename('d', 'd2') or os.path.isdir('d2') and os.rename('d2', 'd')",
]
PROBE = ("sorted((p, os.path.islink(p), os.path.isfile(p) and open(p, 'rb').read()[:40], "
         "os.path.isfile(p) and oct(os.lstat(p).st_mode & 0o777)) for p in "
         "sorted(os.listdir('.')) + ['d/e/f.txt']), held.tell(), reader.tell()")
SETUP = ("import os\nopen('big.bin', 'wb').write(b'0' * 64)\nheld = open('held.txt', 'a+')\n"
         "open('r.txt', 'w').write('0123456789')\nreader = open('r.txt')")


def _run(env, code: str) -> str:
    return env.step("<tool_call>" + json.dumps({"name": "python", "arguments": {"code": code}}) + "</tool_call>")[0]


@pytest.mark.parametrize("seed", range(3))
def test_fuzz_file_operations_branch_exactly(seed):
    """Random file operations (links, renames, truncation, held fds, dir fds, /proc/self/fd, maps) with
    snapshots taken along the way: restoring any snapshot and replaying the rest gives what the
    straight run gave, and no branch changes another's files."""
    rng = random.Random(seed)
    ops = [rng.choice(FILE_OPS).format(n=rng.randrange(10)) for _ in range(14)]
    env = gym.make("trace_envs/PythonMath-v0", max_turns=100,
                   sandbox=SandboxConfig(timeout_s=4, kill_grace_s=1, preload=())).unwrapped
    try:
        env.reset(seed=seed)
        assert _run(env, SETUP) == "(no output)"
        straight, snaps = [], []
        for i, op in enumerate(ops):
            if rng.random() < 0.4:
                snaps.append((i, env.snapshot()))
            straight.append((_run(env, op), _run(env, PROBE)))
        for i, snap in reversed(snaps):  # the latest first: later branches run over earlier ones' files
            env.restore(snap)
            replay = [(_run(env, op), _run(env, PROBE)) for op in ops[i:]]
            assert replay == straight[i:], (seed, i, ops[i:])
            assert not env._episode_info.get("restored_by_replay")
    finally:
        env.close()
