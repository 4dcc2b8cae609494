"""The generated math task set: determinism, splits, and answers checked against brute force."""

from __future__ import annotations

import contextlib
import io
import itertools
import math
import re
import subprocess
import sys
from fractions import Fraction
from typing import Any

import pytest

from trace_envs.core import Task, TaskSet
from trace_envs.tasks.math_gen import (
    ANSWER_INSTRUCTION,
    DEFAULT_SPLIT_SIZES,
    MATH_FAMILIES,
    default_math_tasks,
    generate_math_tasks,
)


# ------------------------------------------------------------ brute force
def _is_prime(k: int) -> bool:
    return k >= 2 and all(k % d for d in range(2, math.isqrt(k) + 1))


def _paths(x: int, y: int, blocked: set[tuple[int, int]]) -> int:
    """Paths from (0, 0) to (x, y) by enumeration (every path is walked)."""
    if x < 0 or y < 0 or (x, y) in blocked:
        return 0
    if x == y == 0:
        return 1
    return _paths(x - 1, y, blocked) + _paths(x, y - 1, blocked)


def _derangements(n: int) -> int:
    if n <= 8:
        return sum(all(p[i] != i for i in range(n)) for p in itertools.permutations(range(n)))
    return int(math.factorial(n) * sum(Fraction((-1) ** k, math.factorial(k)) for k in range(n + 1)))


def _brute(family: str, p: dict[str, Any]) -> str:
    """The answer recomputed naively from the task's parameters (levels 1 and 2 only)."""
    if family == "divisor_count":
        return str(sum(p["n"] % d == 0 for d in range(1, p["n"] + 1)))
    if family == "divisor_sum":
        return str(sum(d for d in range(1, p["n"] + 1) if p["n"] % d == 0))
    if family == "totient":
        return str(sum(math.gcd(k, p["n"]) == 1 for k in range(1, p["n"] + 1)))
    if family == "prime_count":
        return str(sum(_is_prime(k) for k in range(p["a"], p["b"] + 1)))
    if family == "digit_sum_power":
        value, total = 1, 0
        for _ in range(p["b"]):
            value *= p["a"]
        while value:
            value, digit = divmod(value, 10)
            total += digit
        return str(total)
    if family == "modpow":
        value = 1
        for _ in range(p["b"]):
            value = value * p["a"] % p["m"]
        return str(value)
    if family == "mod_inverse":
        return str(next(x for x in range(1, p["m"]) if p["a"] * x % p["m"] == 1))
    if family == "crt":
        return str(next(x for x in itertools.count(1)
                        if all(x % m == r for r, m in zip(p["residues"], p["moduli"]))))
    if family == "binomial":
        row = [1]
        for _ in range(p["n"]):
            row = [a + b for a, b in zip([0, *row], [*row, 0])]
        return str(row[p["k"]] % p.get("m", 10**100))
    if family == "derangements":
        return str(_derangements(p["n"]))
    if family == "lattice_paths":
        return str(_paths(p["width"], p["height"], {tuple(b) for b in p["blocked"]}))
    if family == "count_divisible":
        return str(sum((k % p["a"] == 0 or k % p["b"] == 0) and k % p["c"] != 0 for k in range(1, p["n"] + 1)))
    if family == "digit_sum_count":
        return str(sum(sum(map(int, str(k))) == p["s"] for k in range(1, p["n"] + 1)))
    if family == "power_sum":
        n, e = p["n"], p["p"]
        closed = {1: n * (n + 1) // 2, 2: n * (n + 1) * (2 * n + 1) // 6, 3: (n * (n + 1) // 2) ** 2}
        return str(closed[e])
    if family == "base_conversion":
        return "".join(reversed(list(_digits(p["n"], p["base"]))))
    if family == "coprime_probability":
        f = Fraction(sum(math.gcd(k, p["m"]) == 1 for k in range(1, p["n"] + 1)), p["n"])
        return str(f)
    if family == "fibonacci":
        fib = [0, 1]
        while len(fib) <= p["n"]:
            fib.append(fib[-1] + fib[-2])
        return str(fib[p["n"]])
    if family == "factorial_zeros":
        value, zeros = math.factorial(p["n"]), 0
        while value % p["base"] == 0:
            value //= p["base"]
            zeros += 1
        return str(zeros)
    raise AssertionError(f"no brute force for {family}")


def _digits(n: int, base: int):
    while n:
        n, d = divmod(n, base)
        yield str(d)


def _run_in_process(code: str) -> str:
    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        exec(compile(code, "<solution_code>", "exec"), {"__name__": "__main__"})
    return buffer.getvalue().strip()


# ----------------------------------------------------------------- tests
@pytest.mark.parametrize("family", MATH_FAMILIES)
def test_answers_match_brute_force_on_small_levels(family: str) -> None:
    tasks = generate_math_tasks(6, seed=11, levels=(1, 2), families=[family])
    assert [t.data["level"] for t in tasks] == [1, 2, 1, 2, 1, 2] or [t.data["level"] for t in tasks] == [1, 1, 1, 2, 2, 2]
    for task in tasks:
        assert task.data["answer"] == _brute(family, task.data["params"]), task.prompt


def test_every_solution_code_prints_its_answer_on_levels_1_and_2() -> None:
    for task in generate_math_tasks(2 * len(MATH_FAMILIES), seed=3, levels=(1, 2)):
        assert _run_in_process(task.data["solution_code"]) == task.data["answer"], task.task_id


def test_solution_code_run_with_python_c_prints_the_answer_on_level_3() -> None:
    """One level-3 task per family, each program run as ``python -c`` (as a demo policy would run it)."""
    for task in generate_math_tasks(len(MATH_FAMILIES), seed=4, levels=(3,)):
        result = subprocess.run([sys.executable, "-c", task.data["solution_code"]],
                                capture_output=True, text=True, timeout=60, check=False)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == task.data["answer"], task.task_id


def test_generation_is_deterministic_and_seeded() -> None:
    first = generate_math_tasks(40, seed=7)
    again = generate_math_tasks(40, seed=7)
    other = generate_math_tasks(40, seed=8)
    assert first == again
    assert [t.fingerprint for t in first] == [t.fingerprint for t in again]
    assert [t.prompt for t in first] != [t.prompt for t in other]
    assert [t.task_id for t in first[:2]] == ["math-s7-0000", "math-s7-0001"]
    # a longer run starts with the same tasks: index i depends only on (seed, i)
    assert generate_math_tasks(10, seed=7) == first[:10]


def test_families_and_levels_cycle_evenly() -> None:
    tasks = generate_math_tasks(2 * 3 * len(MATH_FAMILIES), seed=0)
    counts: dict[tuple[str, int], int] = {}
    for t in tasks:
        key = (t.data["family"], t.data["level"])
        counts[key] = counts.get(key, 0) + 1
    assert set(counts) == {(f, lv) for f in MATH_FAMILIES for lv in (1, 2, 3)}
    assert set(counts.values()) == {2}


def test_task_fields_and_prompt_format() -> None:
    for task in generate_math_tasks(3 * len(MATH_FAMILIES), seed=2):
        assert isinstance(task, Task)
        assert task.prompt.endswith(ANSWER_INSTRUCTION)
        assert "<answer>\\boxed{...}</answer>" in task.prompt
        data = task.data
        assert set(data) >= {"answer", "family", "level", "params", "solution_code"}
        assert isinstance(data["answer"], str) and data["answer"]
        assert re.fullmatch(r"-?\d+(/\d+)?", data["answer"]), data["answer"]
        if "/" in data["answer"]:
            num, den = map(int, data["answer"].split("/"))
            assert math.gcd(num, den) == 1 and den > 1  # canonical: reduced, never "k/1"
        assert data["family"] in MATH_FAMILIES and data["level"] in (1, 2, 3)


def test_level_three_is_bigger_than_level_one() -> None:
    """Level controls size: the largest number in a level-3 problem (prompt or answer) dwarfs level 1's."""
    def biggest(task: Task) -> int:
        text = task.prompt.replace(ANSWER_INSTRUCTION, "") + " " + task.data["answer"]
        return max(int(x) for x in re.findall(r"\d+", text))

    for family in MATH_FAMILIES:
        (easy,) = generate_math_tasks(1, seed=5, levels=(1,), families=[family])
        (hard,) = generate_math_tasks(1, seed=5, levels=(3,), families=[family])
        assert biggest(hard) >= 10 * biggest(easy), family


def test_default_splits() -> None:
    train, test = default_math_tasks("train"), default_math_tasks("test")
    assert isinstance(train, TaskSet) and isinstance(test, TaskSet)
    assert (len(train), len(test)) == (DEFAULT_SPLIT_SIZES["train"], DEFAULT_SPLIT_SIZES["test"]) == (300, 100)
    assert (train.name, test.name) == ("math-default-train", "math-default-test")
    assert train.ids()[7] == "math-train-0007" and test.ids()[42] == "math-test-0042"
    train_prompts = {t.prompt for t in train.values()}
    test_prompts = {t.prompt for t in test.values()}
    assert len(train_prompts) == 300 and len(test_prompts) == 100
    assert not train_prompts & test_prompts
    assert {t.data["family"] for t in test.values()} == set(MATH_FAMILIES)
    assert {t.data["level"] for t in train.values()} == {1, 2, 3}
    # stable across calls (a fresh TaskSet each time, equal content)
    assert [t.fingerprint for t in default_math_tasks("test").values()] == [t.fingerprint for t in test.values()]


def test_default_split_is_pinned() -> None:
    """Changing the generator changes the benchmark: this pins a few default tasks."""
    train, test = default_math_tasks("train"), default_math_tasks("test")
    pinned = [
        (test["math-test-0000"], "divisor_count", 1, {"n": 56}, "8"),
        (train["math-train-0007"], "crt", 1, {"residues": [1, 1], "moduli": [2, 7]}, "1"),
        (train["math-train-0299"], "count_divisible", 2, {"n": 7243, "a": 10, "b": 8, "c": 18}, "1288"),
    ]
    for task, family, level, params, answer in pinned:
        assert (task.data["family"], task.data["level"], task.data["params"], task.data["answer"]) == (
            family, level, params, answer)
        assert _brute(family, params) == answer


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"n": 3, "families": ["nope"]}, "unknown math families"),
        ({"n": 3, "levels": (0,)}, "levels must be"),
        ({"n": 3, "levels": ()}, "must not be empty"),
        ({"n": -1}, "n must be"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, Any], message: str) -> None:
    n = kwargs.pop("n")
    with pytest.raises(ValueError, match=message):
        generate_math_tasks(n, **kwargs)


def test_unknown_split_is_refused() -> None:
    with pytest.raises(ValueError, match="split must be"):
        default_math_tasks("validation")


# ------------------------------------------------------------- DeepScaleR
DEEPSCALER_ROWS = [
    {"problem": "What is $1 + 1$?", "answer": "2", "solution": "Add: $1 + 1 = 2$."},
    {"problem": "Simplify $\\frac{6}{8}$.", "answer": "\\frac{3}{4}", "solution": "Divide by 2."},
    {"problem": "How many primes are below 10?", "answer": "4", "solution": "2, 3, 5, 7."},
]


def _write_jsonl(path: Any, rows: list[dict[str, Any]]) -> Any:
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_load_deepscaler_from_local_jsonl(tmp_path: Any) -> None:
    from trace_envs.tasks.deepscaler import load_deepscaler

    path = _write_jsonl(tmp_path / "deepscaler.jsonl", DEEPSCALER_ROWS)
    tasks = load_deepscaler(str(path), cache_dir=str(tmp_path / "cache"))
    assert isinstance(tasks, TaskSet) and tasks.name == "deepscaler-train"
    assert tasks.ids() == ["deepscaler-train-00000", "deepscaler-train-00001", "deepscaler-train-00002"]
    second = tasks["deepscaler-train-00001"]
    assert second.prompt == f"Simplify $\\frac{{6}}{{8}}$.\n\n{ANSWER_INSTRUCTION}"
    assert dict(second.data) == {"answer": "\\frac{3}{4}", "solution": "Divide by 2.", "source": "deepscaler", "index": 1}
    assert len(load_deepscaler(str(path), limit=2, cache_dir=str(tmp_path / "cache"))) == 2
    assert load_deepscaler(str(path), split="test", cache_dir=str(tmp_path / "cache")).ids()[0] == "deepscaler-test-00000"


def test_load_deepscaler_from_json_list_and_parquet(tmp_path: Any) -> None:
    import json

    import datasets

    from trace_envs.tasks.deepscaler import load_deepscaler

    rows = [{**DEEPSCALER_ROWS[0], "answer": 2}, {"problem": "3?", "answer": "3", "solution": None}]
    (tmp_path / "rows.json").write_text(json.dumps(rows))
    from_json = load_deepscaler(str(tmp_path / "rows.json"), cache_dir=str(tmp_path / "cache"))
    assert [t.data["answer"] for t in from_json.values()] == ["2", "3"]  # numbers become strings
    assert from_json["deepscaler-train-00001"].data["solution"] == ""
    datasets.Dataset.from_list(DEEPSCALER_ROWS).to_parquet(str(tmp_path / "rows.parquet"))
    from_parquet = load_deepscaler(str(tmp_path / "rows.parquet"), cache_dir=str(tmp_path / "cache"))
    assert [t.data["answer"] for t in from_parquet.values()] == ["2", "\\frac{3}{4}", "4"]


def test_rows_without_an_answer_are_skipped_with_a_count(tmp_path: Any) -> None:
    """The public DeepScaleR set is reported to hold a few rows without an answer: they never refuse the file."""
    import datasets

    from trace_envs.tasks.deepscaler import SkippedRowsWarning, load_deepscaler

    rows = [DEEPSCALER_ROWS[0], {"problem": "No answer here?", "answer": None, "solution": "?"},
            DEEPSCALER_ROWS[1], {"problem": "  ", "answer": "3", "solution": ""},
            {"problem": "Blank?", "answer": "", "solution": ""}, DEEPSCALER_ROWS[2]]
    datasets.Dataset.from_list(rows).to_parquet(str(tmp_path / "rows.parquet"))
    with pytest.warns(SkippedRowsWarning, match=r"skipped 3 of 6 rows .*\(rows 1, 3, 4\)"):
        tasks = load_deepscaler(str(tmp_path / "rows.parquet"), cache_dir=str(tmp_path / "cache"))
    assert tasks.ids() == ["deepscaler-train-00000", "deepscaler-train-00002", "deepscaler-train-00005"]
    assert [t.data["index"] for t in tasks.values()] == [0, 2, 5], "ids keep the row's index in the file"


def test_load_deepscaler_errors(tmp_path: Any) -> None:
    from trace_envs.errors import InvalidTaskError, TaskNotFoundError
    from trace_envs.tasks.deepscaler import load_deepscaler

    cache = str(tmp_path / "cache")
    with pytest.raises(TaskNotFoundError, match="no DeepScaleR file"):
        load_deepscaler(str(tmp_path / "missing.jsonl"), cache_dir=cache)
    bad = _write_jsonl(tmp_path / "bad.jsonl", [{"question": "1+1?", "answer": "2"}])
    with pytest.raises(InvalidTaskError, match=r"lack the field\(s\) \['problem'\]"):
        load_deepscaler(str(bad), cache_dir=cache)
    empty = _write_jsonl(tmp_path / "empty.jsonl", [DEEPSCALER_ROWS[0], {"problem": "x?", "answer": " "}])
    with pytest.raises(InvalidTaskError, match="row 1 has an empty problem or answer"):
        load_deepscaler(str(empty), cache_dir=cache, strict=True)
    nothing = _write_jsonl(tmp_path / "nothing.jsonl", [{"problem": "x?", "answer": ""}])
    with pytest.warns(UserWarning), pytest.raises(InvalidTaskError, match="none of its 1 rows"):
        load_deepscaler(str(nothing), cache_dir=cache)
    (tmp_path / "garbage.jsonl").write_text("not json {{{\n")
    with pytest.raises(InvalidTaskError, match="could not be read"):
        load_deepscaler(str(tmp_path / "garbage.jsonl"), cache_dir=cache)
    (tmp_path / "rows.csv").write_text("problem,answer\n1+1?,2\n")
    with pytest.raises(InvalidTaskError, match="not a .json, .jsonl or .parquet"):
        load_deepscaler(str(tmp_path / "rows.csv"), cache_dir=cache)
    with pytest.raises(ValueError, match="limit"):
        load_deepscaler(str(bad), limit=-1, cache_dir=cache)


def test_task_modules_import_cheaply() -> None:
    code = ("import sys, trace_envs.tasks as t, trace_envs.tasks.math_gen, trace_envs.tasks.deepscaler\n"
            "assert t.default_math_tasks is trace_envs.tasks.math_gen.default_math_tasks\n"
            "heavy = [m for m in ('datasets', 'sympy', 'math_verify', 'torch') if m in sys.modules]\n"
            "assert not heavy, heavy")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr
