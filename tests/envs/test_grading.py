"""grade_answer / normalize_answer: equivalences, rejections, garbage, time bounds, threads."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from typing import Any

import pytest

from tests.envs.signals import stop
from trace_envs.python_tool import _grading_worker
from trace_envs.python_tool._host import proc_stat
from trace_envs.python_tool.grading import (
    MAX_INPUT_CHARS,
    MAX_SYMBOLIC_CHARS,
    grade_answer,
    normalize_answer,
    parse_plain_number,
)
from trace_envs.tasks.math_gen import default_math_tasks

EQUIVALENT = [
    # plain numbers: exact rational comparison, no sympy
    ("1/2", "0.5"),
    ("\\frac{1}{2}", "0.5"),
    ("\\dfrac{1}{2}", "1/2"),
    ("0.50", "\\frac12"),
    ("42.0", "42"),
    ("42", "42."),
    ("-\\frac{1}{2}", "-0.5"),
    ("1,000", "1000"),
    ("\\frac{6}{4}", "3/2"),
    ("  7 ", "7"),
    ("$42$", "42"),
    ("\\boxed{42}", "42"),
    ("<answer>\\boxed{3/7}</answer>", "3/7"),
    ("\\text{42}", "42"),
    ("12^\\circ", "12"),
    # symbolic: math_verify
    ("2^{10}", "1024"),
    ("1024", "2^{10}"),
    ("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2"),
    ("2\\sqrt{2}", "\\sqrt{8}"),
    ("1+x^2", "x^2+1"),
    ("(1, 2)", "(1,2)"),
    ("\\{1, 2\\}", "\\{2, 1\\}"),
    ("3.141593", "\\pi"),
    ("10\\%", "0.1"),
    ("\\frac{\\pi}{4}", "\\pi/4"),
    ("The answer is 42", "42"),
    # documented choice: an assignment to one variable counts as its right-hand side
    ("x = 3", "3"),
    ("x=3", "3"),
    ("3", "x = 3"),
]

NOT_EQUIVALENT = [
    ("41", "42"),
    ("-42", "42"),
    ("4 2", "42"),  # inner whitespace never glues digits
    ("1 2 3 42", "42"),
    ("41 or 42", "42"),
    ("41, 42", "42"),
    ("0.33", "1/3"),
    ("3/7", "7/3"),
    ("\\frac{1}{0}", "1"),
    ("2^{11}", "1024"),
    ("x^2+1", "x^2-1"),
    ("\\sqrt{3}", "\\sqrt{2}"),
    ("(1, 2)", "[1, 2]"),
    ("3.14", "\\pi"),
    ("", "42"),
    ("42", ""),
    ("   ", "   "),
    ("\\boxed{}", "42"),
]


@pytest.mark.parametrize(("predicted", "gold"), EQUIVALENT)
def test_equivalent_forms_are_accepted(predicted: str, gold: str) -> None:
    assert grade_answer(predicted, gold) is True


@pytest.mark.parametrize(("predicted", "gold"), NOT_EQUIVALENT)
def test_wrong_answers_are_rejected(predicted: str, gold: str) -> None:
    assert grade_answer(predicted, gold) is False


@pytest.mark.parametrize(
    ("predicted", "gold"),
    [(None, "1"), ("1", None), (1, "1"), (b"1", "1"), (["1"], "1"), (float("nan"), "nan"), (object(), "x")],
)
def test_non_strings_give_false(predicted: Any, gold: Any) -> None:
    assert grade_answer(predicted, gold) is False


GARBAGE = [
    "{}{{",
    "}}}}",
    "\\frac",
    "\\frac{",
    "\\boxed{",
    "$$$",
    "\\\\\\\\",
    "\x00\x01\x02",
    "ÿ̸̡͔̈́ü̴̢̧",
    "<answer></answer>",
    "\\left( \\right",
    "import os; os.system('echo pwned')",
    "__import__('os').system('echo pwned')",
    "lambda: 0",
    "1/0",
    "0/0",
]

PATHOLOGICAL = [
    "9^{9^{9^{9}}}",
    "10^{10^{10}}",
    "2^{2^{2^{2^{2^{2}}}}}",
    "2**99999999999",
    "1000000!",
    "(10^{8})!",
    "\\binom{10^{9}}{5\\cdot 10^{8}}",
    "\\binom{1000000000}{500000000}",
    "(" * 500 + "1" + ")" * 500,
    "{" * 5000 + "1" + "}" * 5000,
    "\\sqrt{" * 300 + "2" + "}" * 300,
    "1" * 50_000,
    "x+" * 5_000 + "1",
]


@pytest.mark.parametrize("text", GARBAGE)
def test_garbage_gives_false_and_never_raises(text: str) -> None:
    assert grade_answer(text, "42") is False
    assert grade_answer("42", text) is False
    assert isinstance(normalize_answer(text), str)


@pytest.mark.parametrize("text", PATHOLOGICAL, ids=lambda t: t[:24])
def test_pathological_inputs_return_false_quickly(text: str) -> None:
    start = time.monotonic()
    assert grade_answer(text, "5") is False
    assert grade_answer("5", text) is False
    assert time.monotonic() - start < 2.0


def test_oversized_inputs_are_refused_without_work() -> None:
    huge = "\\boxed{42}" + " " * MAX_INPUT_CHARS
    start = time.monotonic()
    assert grade_answer(huge, "42") is False
    assert grade_answer("42", huge) is False
    assert time.monotonic() - start < 0.1
    terms = MAX_SYMBOLIC_CHARS // 2 + 1
    long_expr = "+".join(["1"] * terms)
    assert len(long_expr) > MAX_SYMBOLIC_CHARS
    assert grade_answer(long_expr, str(terms)) is False  # too long for sympy: compared as text only
    assert grade_answer(long_expr, long_expr) is True  # ... but identical text still matches


def _gone(pid: int) -> bool:
    """The process has exited (a zombie counts: whether init reaps orphans depends on the container)."""
    stat = proc_stat(pid)
    return stat is None or stat[0] in ("Z", "X")


def test_slow_symbolic_comparison_hits_the_deadline_and_its_worker_is_killed() -> None:
    """An input that passes the structural screen but makes sympy work for seconds."""
    assert grade_answer("2^{10}", "1024") is True  # leaves a warm idle worker
    before = set(_grading_worker._POOL.idle_pids())
    start = time.monotonic()
    assert grade_answer("(x+y+1)^{90}", "(x+1)^{90} + y", timeout_s=0.3) is False
    assert time.monotonic() - start < 1.5
    after = set(_grading_worker._POOL.idle_pids())
    killed = before - after
    assert len(killed) == 1 and all(_gone(pid) for pid in killed)  # killed and reaped, not left burning CPU
    assert grade_answer("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2") is True  # the next call gets a working worker


def test_the_budget_is_the_workers_cpu_time_not_the_wall_clock() -> None:
    """A worker that gets no CPU for a while (a loaded machine; here SIGSTOP) still answers correctly."""
    assert grade_answer("2^{10}", "1024") is True
    pid = _grading_worker._POOL.idle_pids()[-1]  # the worker the next call takes
    stop(pid)
    resume = threading.Timer(1.0, os.kill, (pid, signal.SIGCONT))
    resume.start()
    try:
        start = time.monotonic()
        assert grade_answer("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2", timeout_s=0.5) is True
        assert time.monotonic() - start >= 0.9  # it waited past 0.5 s of wall time for the stopped worker
    finally:
        resume.join()
    assert pid in _grading_worker._POOL.idle_pids()
    stop(pid)  # ... but the wall-clock cap still holds: stopped for good, it is given up
    start = time.monotonic()
    assert grade_answer("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2", timeout_s=0.1) is False
    assert time.monotonic() - start < _grading_worker.WALL_FACTOR * 0.1 + 0.5
    assert _gone(pid)


def test_a_worker_that_cannot_start_is_a_loud_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """No quiet "not equivalent" for every symbolic answer: a broken grading backend is an EnvSetupError."""
    from trace_envs.errors import EnvSetupError

    _grading_worker._POOL.shutdown()
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    with pytest.raises(EnvSetupError, match="grading worker .*/nonexistent/python.* could not start"):
        grade_answer("2^{10}", "1024")
    with pytest.raises(EnvSetupError, match="could not start"):
        _grading_worker.check_grading_worker()
    assert grade_answer("0.5", "1/2") is True  # stages 1-2 need no worker
    assert grade_answer("x" * 200_000, "1") is False, "inputs still never raise"
    monkeypatch.undo()
    _grading_worker.check_grading_worker()
    assert _grading_worker._POOL.idle_pids(), "the checked worker waits in the pool"
    assert grade_answer("2^{10}", "1024") is True


def test_a_dead_idle_worker_is_replaced() -> None:
    assert grade_answer("2^{10}", "1024") is True
    for pid in _grading_worker._POOL.idle_pids():
        os.kill(pid, signal.SIGKILL)
    assert grade_answer("1+x^2", "x^2+1") is True
    assert grade_answer("1+x^2", "x^2+2") is False


def test_workers_run_with_a_memory_cap_and_the_caller_never_imports_math_verify() -> None:
    assert grade_answer("2^{10}", "1024") is True
    pid = _grading_worker._POOL.idle_pids()[0]
    limits = open(f"/proc/{pid}/limits").read()
    line = next(row for row in limits.splitlines() if row.startswith("Max address space"))
    assert line.split()[3] == str(_grading_worker.MEMORY_LIMIT_BYTES)
    probe = (
        "import sys\n"
        "from trace_envs.python_tool.grading import grade_answer\n"
        "assert grade_answer('2^{10}', '1024') and not grade_answer('2^{10}', '1000')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('sympy', 'math_verify')))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize("text", ["\ud800x^2", "x\x00^2", "\\frac{\n}{" + "a" * 300 + "}", '{"verdict": true}\n', "x" * 399])
def test_hostile_text_is_not_equivalent_and_keeps_the_worker(text: str) -> None:
    assert grade_answer("x^2+1", "1+x^2") is True
    before = _grading_worker._POOL.idle_pids()
    assert grade_answer(text, "x^2") is False
    assert grade_answer("x^2", text) is False
    assert _grading_worker._POOL.idle_pids() == before  # answered in protocol, not killed and restarted


def test_a_worker_does_not_outlive_a_killed_host() -> None:
    probe = (
        "from trace_envs.python_tool import _grading_worker\n"
        "from trace_envs.python_tool.grading import grade_answer\n"
        "assert grade_answer('2^{10}', '1024')\n"
        "print(_grading_worker._POOL.idle_pids()[0], flush=True)\n"
        "import time; time.sleep(60)\n"
    )
    host = subprocess.Popen([sys.executable, "-c", probe], stdout=subprocess.PIPE, text=True)
    try:
        assert host.stdout is not None
        worker = int(host.stdout.readline())
        assert not _gone(worker)
    finally:
        host.kill()
        host.wait()
    deadline = time.monotonic() + 10
    while not _gone(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(worker)  # it noticed its parent was gone and exited (reaped by init)


def test_grading_after_fork_uses_the_childs_own_workers() -> None:
    assert grade_answer("2^{10}", "1024") is True
    parent_workers = _grading_worker._POOL.idle_pids()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            ok = grade_answer("\\sqrt{8}", "2\\sqrt{2}") and not grade_answer("\\sqrt{8}", "3")
            fresh = not set(_grading_worker._POOL.idle_pids()) & set(parent_workers)
            os.write(write_end, b"1" if ok and fresh else b"0")
        finally:
            os._exit(0)
    os.close(write_end)
    os.waitpid(pid, 0)
    assert os.read(read_end, 1) == b"1"
    os.close(read_end)
    assert all(not _gone(worker) for worker in parent_workers)  # the child left its parent's workers alone
    assert grade_answer("1024", "2^{10}") is True


def test_grading_from_many_threads_matches_sequential_grading() -> None:
    cases = (EQUIVALENT + NOT_EQUIVALENT) * 3
    expected = [grade_answer(p, g) for p, g in cases]
    with ThreadPoolExecutor(max_workers=8) as pool:
        got = list(pool.map(lambda pg: grade_answer(*pg), cases))
    assert got == expected
    assert expected[: len(EQUIVALENT)] == [True] * len(EQUIVALENT)


def test_pathological_inputs_are_bounded_off_the_main_thread() -> None:
    results: list[bool] = []
    worker = threading.Thread(target=lambda: results.extend(grade_answer(t, "5") for t in PATHOLOGICAL[:8]))
    start = time.monotonic()
    worker.start()
    worker.join(30)
    assert not worker.is_alive()
    assert results == [False] * 8
    assert time.monotonic() - start < 5


def test_grading_leaves_sigalrm_alone() -> None:
    """math_verify's own timeouts use SIGALRM; ours must not replace a caller's handler or cancel its alarm."""
    fired: list[int] = []

    def handler(signum: int, frame: Any) -> None:
        fired.append(signum)

    previous = signal.signal(signal.SIGALRM, handler)
    try:
        signal.alarm(30)
        assert grade_answer("\\frac{\\sqrt{2}}{2}", "\\sqrt{2}/2") is True
        assert signal.getsignal(signal.SIGALRM) is handler
        remaining = signal.alarm(0)
        assert remaining > 0  # our alarm was not cancelled
        assert not fired
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_every_default_test_answer_grades_against_itself_and_not_against_a_neighbour() -> None:
    for task in default_math_tasks("test").values():
        answer = task.data["answer"]
        assert grade_answer(answer, answer)
        assert grade_answer(f"<answer>\\boxed{{{answer}}}</answer>", answer)
        value = Fraction(answer)
        latex = f"\\frac{{{value.numerator}}}{{{value.denominator}}}" if value.denominator > 1 else f"{answer}.0"
        assert grade_answer(latex, answer), (latex, answer)
        assert not grade_answer(str(value + 1), answer)


@pytest.mark.parametrize(
    ("text", "normal"),
    [
        ("42", "42"),
        (" 42.0 ", "42"),
        ("0.50", "1/2"),
        ("\\frac{6}{4}", "3/2"),
        ("\\dfrac{3}{7}", "3/7"),
        ("-0", "0"),
        ("+7", "7"),
        ("1,234,567", "1234567"),
        ("$\\boxed{12}$", "12"),
        ("<answer>\\boxed{\\frac{\\sqrt{3}}{2}}</answer>", "\\frac{\\sqrt{3}}{2}"),
        ("\\left( 1, 2 \\right)", "(1,2)"),
        ("2 \\pi r", "2\\pi r"),
        ("4 2", "4 2"),
        ("\\text{Monday}", "Monday"),
        ("90^\\circ", "90"),
        ("5.", "5"),
        (None, ""),
        (12, ""),
    ],
)
def test_normalize_answer(text: Any, normal: str) -> None:
    assert normalize_answer(text) == normal


@pytest.mark.parametrize(
    ("text", "value"),
    [("12", Fraction(12)), ("-3/6", Fraction(-1, 2)), ("\\frac{3}{7}", Fraction(3, 7)), ("\\frac37", Fraction(3, 7)),
     (".5", Fraction(1, 2)), ("1,000.25", Fraction(4001, 4)), ("1/0", None), ("4 2", None), ("x", None),
     ("1.2.3", None), ("", None), ("-", None), ("1" * 3000, None)],
)
def test_parse_plain_number(text: str, value: Fraction | None) -> None:
    assert parse_plain_number(text) == value


# MATH / DeepScaleR answer formats (MATH writes currency as ``\$``), as a model writes them in ``\boxed{}``.
MATH_FORMATS = [
    ("\\$5", "5"), ("\\$18.90", "18.90"), ("\\$18.90", "\\$18.90"), ("18.9", "\\$18.90"), ("\\$ 5", "5"),
    ("\\$5.00", "5"), ("5", "\\$5"), ("\\$1,000", "1000"), ("$5$", "5"), ("0.333333", "\\frac{1}{3}"),
    ("1/3", "0.333333"), ("0.3333", "\\frac13"), ("0.33", "1/3"), ("0.5", "\\frac{1}{2}"), ("\\dfrac{3}{4}", "0.75"),
    ("x = 3", "3"), ("3.141593", "\\pi"), ("10\\%", "10"), ("10%", "10"), ("1,000", "1000"), ("\\text{(A)}", "A"),
    ("(A)", "A"), ("A", "\\text{(A)}"), ("90^\\circ", "90"), ("\\frac{\\sqrt{2}}{2}", "\\frac{1}{\\sqrt{2}}"),
    ("5 dollars", "5"), ("2, 3", "3, 2"), ("\\{2,3\\}", "\\{3,2\\}"), ("[1,2)", "[1,2)"), ("x^2+1", "1+x^2"),
    ("42", "41"), ("12 \\text{ cm}", "12"), ("6\\sqrt{2}", "\\sqrt{72}"), ("", "5"), ("2^{10}", "1024"),
    ("\\frac{7}{2}", "3.5"), ("-\\frac{1}{2}", "-0.5"), ("\\sqrt{2}", "1.414214"), ("\\sqrt{2}", "1.41"),
]


def _verl_math_verify_reward(model_output: str, ground_truth: str) -> float:
    """verl's math-verify reward as its ``compute_score`` is published: the gold wrapped in ``\\boxed{}``
    and read with LaTeX extraction, the response with plain-expression and LaTeX extraction, 6 decimals."""
    from math_verify.metric import math_metric
    from math_verify.parser import ExprExtractionConfig, LatexExtractionConfig

    metric = math_metric(gold_extraction_target=(LatexExtractionConfig(),),
                         pred_extraction_target=(ExprExtractionConfig(), LatexExtractionConfig()))
    try:
        score, _ = metric(["\\boxed{" + ground_truth + "}"], [model_output])
    except Exception:  # noqa: BLE001 - verl scores any failure 0
        score = 0.0
    return score


@pytest.mark.parametrize(("predicted", "gold"), MATH_FORMATS)
def test_default_mode_agrees_with_verls_math_verify_reward(predicted: str, gold: str) -> None:
    response = f"So the final answer is \\boxed{{{predicted}}}." if predicted else "I do not know."
    reference = _verl_math_verify_reward(response, gold) == 1.0
    assert grade_answer(f"\\boxed{{{predicted}}}" if predicted else "", gold) is reference
    assert grade_answer(predicted, gold) is reference, "the <answer> content without \\boxed grades the same"


@pytest.mark.parametrize(("predicted", "gold"), MATH_FORMATS + EQUIVALENT + NOT_EQUIVALENT)
def test_strict_mode_never_accepts_more_than_the_default(predicted: str, gold: str) -> None:
    if grade_answer(predicted, gold, mode="strict"):
        assert grade_answer(predicted, gold)


def test_strict_mode_compares_plain_numbers_exactly() -> None:
    assert grade_answer("0.333333", "1/3") and not grade_answer("0.333333", "1/3", mode="strict")
    assert grade_answer("\\$5", "5", mode="strict") and grade_answer("\\$18.90", "18.9", mode="strict")
    with pytest.raises(ValueError, match="mode must be one of"):
        grade_answer("1", "1", mode="lenient")


def test_python_math_grading_option() -> None:
    from trace_envs.python_tool.env import PythonMathEnv

    task = {"prompt": "What is 1/3 as a decimal?", "answer": "\\frac{1}{3}", "task_id": "third"}
    rewards = {}
    for grading in ("math-verify", "strict"):
        env = PythonMathEnv(tasks="test", grading=grading)
        try:
            env.reset(options={"task": task})
            rewards[grading] = env.step("<answer>0.333333</answer>")[1]
            assert f"grading={grading}" in env.config_key
        finally:
            env.close()
    assert rewards == {"math-verify": 1.0, "strict": 0.0}
    with pytest.raises(ValueError, match="grading must be one of"):
        PythonMathEnv(tasks="test", grading="exact")


def _best_of(repeats: int, fn: Any) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


@pytest.mark.parametrize("unit", ["<answer>", "<answer>x", "<answer>1</answer><answer>", "x + 1 ", "\\boxed{"])
def test_grading_time_is_linear_in_the_answer_length(unit: str) -> None:
    """96k characters take about 96 times as long as 1k (a quadratic stage would take about 9,000 times)."""
    short = (unit * (1_000 // len(unit) + 1))[:1_000]
    long = (unit * (96_017 // len(unit) + 1))[:96_017]
    assert len(long) <= MAX_INPUT_CHARS
    short_s = _best_of(5, lambda: grade_answer(short, "42"))
    long_s = _best_of(3, lambda: grade_answer(long, "42"))
    assert long_s < 400 * max(short_s, 20e-6), (short_s, long_s)


def test_a_worker_stopped_while_starting_holds_the_caller_no_longer_than_the_wall_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The start of a fresh worker counts against the call's WALL_FACTOR × timeout_s cap; the stopped
    worker goes on starting in the background once resumed, and joins the pool."""
    _grading_worker._POOL.shutdown()
    stopped: list[int] = []
    real_popen = subprocess.Popen

    def popen_then_stop(*args: Any, **kwargs: Any) -> subprocess.Popen:
        proc = real_popen(*args, **kwargs)
        os.kill(proc.pid, signal.SIGSTOP)
        stopped.append(proc.pid)
        return proc

    monkeypatch.setattr(_grading_worker.subprocess, "Popen", popen_then_stop)
    timeout_s = 0.1
    start = time.monotonic()
    try:
        assert grade_answer("2^{10}", "1024", timeout_s=timeout_s) is False
        assert time.monotonic() - start < _grading_worker.WALL_FACTOR * timeout_s + 0.5
    finally:
        monkeypatch.undo()
        for pid in stopped:
            os.kill(pid, signal.SIGCONT)
    assert len(stopped) == 1
    deadline = time.monotonic() + 60
    while stopped[0] not in _grading_worker._POOL.idle_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert stopped[0] in _grading_worker._POOL.idle_pids()
    assert grade_answer("2^{10}", "1024") is True
