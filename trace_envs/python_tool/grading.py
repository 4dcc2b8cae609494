"""Grading final math answers: is a predicted answer equivalent to the gold one?

Two modes (``grade_answer(..., mode=...)``):

* ``"math-verify"`` (the default) agrees with math-verify as verl's
  ``verl/utils/reward_score/math_verify.py`` uses it: the gold wrapped in
  ``\\boxed{}`` and read with LaTeX extraction, the prediction read from the
  model's ``\\boxed{}``, compared by ``math_verify.verify`` with its default
  6-decimal rounding. So a decimal approximation of a fraction is accepted
  (``0.333333`` for ``\\frac{1}{3}``, not ``0.33``), as verl's reward accepts
  it. An answer in prose (``The answer is 42``) that has no LaTeX reading is
  then tried as the strict mode tries it, so the default mode accepts
  everything the strict one does.
* ``"strict"``: plain numbers are compared as exact rationals
  (``0.333333 != 1/3``), everything else as below. Rewards are never higher
  than in the default mode; use it when a decimal must be exact.

Both decide in three stages, cheapest first:

1. **Normalised text.** Both sides go through :func:`normalize_answer`
   (``<answer>``/``\\boxed{}`` unwrapping, ``$`` and MATH's escaped dollar ``\\$``,
   ``\\left``/``\\right``, spacing, ``\\dfrac``→``\\frac``, plain numbers to a
   canonical rational). Equal → True. (``\\$5``, ``\\$ 5``, ``$5$`` and ``5`` are all ``5``;
   ``\\$18.90`` is ``18.9``.)
2. **Plain numbers.** When both sides are plain numerals (integers, decimals,
   ``p/q``, ``\\frac{p}{q}``, thousands separators) and their exact values are
   equal: True (``0.5 == 1/2 == \\frac{1}{2}``, ``42 == 42.0``). Unequal: False in
   strict mode; the default mode asks math-verify (stage 3), which rounds.
3. **Symbolic equivalence with math_verify** for everything else: ``2^{10}`` vs
   ``1024``, ``\\frac{\\sqrt2}{2}`` vs ``\\sqrt{2}/2``, sets, intervals, ``x^2+1`` vs
   ``1+x^2``. math_verify's own rules apply here, e.g. ``x = 3`` is accepted for
   the gold ``3`` (an assignment to a single variable counts as its right-hand
   side) and a decimal matches a non-rational value to 6 decimals (``3.141593``
   for ``\\pi``).

Contracts:

* ``grade_answer`` never raises for any input: non-strings, empty text, garbage and huge
  inputs (over :data:`MAX_INPUT_CHARS`) give ``False``. It raises
  :class:`~trace_envs.errors.EnvSetupError` only when no grading worker can be started (a broken
  install: every symbolic answer would otherwise be graded wrong without a word);
  :func:`~trace_envs.python_tool._grading_worker.check_grading_worker` checks that up front.
* Time is bounded. Inputs longer than :data:`MAX_SYMBOLIC_CHARS`, nested deeper
  than :data:`MAX_NESTING`, or holding expressions that explode in size (power
  towers, huge exponents, factorials or binomials of big numbers) skip stage 3.
  Stage 3 runs in a worker process (:mod:`trace_envs.python_tool._grading_worker`)
  with a budget of ``timeout_s`` seconds of its CPU time (so a verdict does not
  depend on machine load; the wait is capped at ``WALL_FACTOR`` (10) × that in
  wall-clock time) and a memory cap: the caller gets ``False`` when the budget
  runs out, and the worker is killed, whatever sympy was doing (a thread could
  not be stopped in a long C-level step, and would hold the GIL). math_verify's
  ``signal.alarm`` timeouts are not used (they only work on the main thread and
  would clobber a caller's own ``SIGALRM``), so ``grade_answer`` is safe from
  any thread.
* Thread-safe: concurrent callers each get their own worker from the pool.

* Model text is parsed, not run, by this module. Stage 3's prose fallback is
  math_verify's plain-expression extraction, which hands a regex-matched
  arithmetic span to sympy's ``parse_expr``; the verl-style reading is LaTeX only.
  Both run in the worker process, never in the caller's.
* When stage 3 is skipped (screened out, or over its deadline) the verdict is
  that of stages 1–2 with exact rationals.

math_verify and sympy are imported by the workers only, never by the caller.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from trace_envs.actions import extract_boxed
from trace_envs.errors import EnvSetupError
from trace_envs.python_tool._grading_worker import symbolic_verdict

__all__ = [
    "GRADING_MODES",
    "grade_answer",
    "normalize_answer",
    "parse_plain_number",
    "MAX_INPUT_CHARS",
    "MAX_SYMBOLIC_CHARS",
    "MAX_NESTING",
]

#: ``mode`` values of :func:`grade_answer`: verl's math-verify semantics (default) or exact rationals.
GRADING_MODES = ("math-verify", "strict")
#: Longer inputs (whole responses included) are refused outright.
MAX_INPUT_CHARS = 100_000
#: Longer answers (after ``<answer>``/``\\boxed{}`` unwrapping) are only compared as text.
MAX_SYMBOLIC_CHARS = 400
#: Deeper bracket nesting is only compared as text (sympy parsing is slow on deep nesting).
MAX_NESTING = 12
#: Plain-number literals longer than this are compared exactly but never handed to sympy.
_MAX_NUMERAL_DIGITS = 2000
#: Largest exponent / factorial argument / binomial argument allowed into sympy.
_MAX_EXPONENT = 10_000
_MAX_FACTORIAL = 2_000
_MAX_COMBINATORIAL_LITERAL = 100_000

_ANSWER_OPEN, _ANSWER_CLOSE = "<answer>", "</answer>"
_INT = r"\d+|\d{1,3}(?:,\d{3})+"
_DECIMAL = re.compile(rf"^([+-]?)({_INT})?(?:\.(\d+))?$")
_FRACTION = re.compile(r"^([+-]?)(\d+)/(\d+)$")
_LATEX_FRACTION = re.compile(r"^([+-]?)\\frac\{([+-]?\d+)\}\{([+-]?\d+)\}$")
_LATEX_FRACTION_SHORT = re.compile(r"^([+-]?)\\frac(\d)(\d)$")
_TEXT_WRAPPER = re.compile(r"^\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}$")
_DANGEROUS_WORDS = re.compile(r"binom|choose|factorial|Gamma|gamma|\\prod|\\sum|!")
_COMBINATORIAL = re.compile(r"binom|choose|factorial|Gamma|gamma|\\prod|!(?!=)")
_INT_LITERAL = re.compile(r"\d+")
_SPACE_BETWEEN_WORDS = re.compile(r"(?<=[A-Za-z0-9]) (?=[A-Za-z0-9])")


# ----------------------------------------------------------------- normalising
def normalize_answer(text: Any) -> str:
    """A canonical text form of a final answer, for exact comparison.

    Takes the last ``<answer>...</answer>`` and then the last ``\\boxed{...}``
    if present; drops ``\\$`` (MATH's escaped dollar), ``$``, ``\\left``/``\\right``, LaTeX spacing commands,
    ``^\\circ``, ``\\%``-escapes, all whitespace and a trailing period; maps
    ``\\dfrac``/``\\tfrac`` to ``\\frac`` and unwraps a lone ``\\text{...}``.
    A plain number becomes its canonical rational: ``"42.0"`` → ``"42"``,
    ``"0.50"`` → ``"1/2"``, ``"\\frac{6}{4}"`` → ``"3/2"``, ``"1,000"`` → ``"1000"``.
    Non-strings give ``""``. Never raises.
    """
    if not isinstance(text, str):
        return ""
    s = _unwrap(text)
    for old, new in (
        ("\\dfrac", "\\frac"), ("\\tfrac", "\\frac"), ("\\left", ""), ("\\right", ""),
        ("\\!", ""), ("\\,", ""), ("\\;", ""), ("\\:", ""), ("\\ ", ""), ("~", ""),
        ("^\\circ", ""), ("^{\\circ}", ""), ("\\%", "%"), ("\\$", ""), ("$", ""),
    ):
        s = s.replace(old, new)
    s = _SPACE_BETWEEN_WORDS.sub("\x00", " ".join(s.split()))  # keep "\\pi r" apart from "\\pir"
    s = s.replace(" ", "").replace("\x00", " ").rstrip(".")
    wrapped = _TEXT_WRAPPER.match(s)
    if wrapped:
        s = wrapped.group(1).strip()
    number = parse_plain_number(s)
    if number is not None:
        return _format_fraction(number)
    return s


def _last_answer(text: str) -> str | None:
    """The body of the last ``<answer>...</answer>`` pair (pairs read left to right, each closed by the first
    ``</answer>`` after its opener), or None. Linear in ``len(text)``: every character is scanned at most
    twice, however many openers are left unclosed."""
    body, pos = None, 0
    while (start := text.find(_ANSWER_OPEN, pos)) >= 0:
        end = text.find(_ANSWER_CLOSE, start + len(_ANSWER_OPEN))
        if end < 0:
            break
        body, pos = text[start + len(_ANSWER_OPEN) : end], end + len(_ANSWER_CLOSE)
    return body


def _unwrap(text: str) -> str:
    """The last ``<answer>`` body, then the last ``\\boxed{}`` body in it, stripped."""
    answer = _last_answer(text)
    s = answer if answer is not None else text
    boxed = extract_boxed(s)
    return (boxed if boxed is not None else s).strip()


def parse_plain_number(text: str) -> Fraction | None:
    """The exact value of a plain numeral, or None.

    Plain numerals: ``12``, ``-3``, ``+7``, ``1,000`` (thousands separators),
    ``0.25``, ``.5``, ``3/7``, ``\\frac{3}{7}``, ``\\frac37``. Surrounding whitespace is ignored;
    inner whitespace makes a text not plain (``"4 2"`` is not 42). A zero
    denominator, or more than 2000 characters, gives None.
    """
    if not isinstance(text, str):
        return None
    s = text.strip()
    if not s or len(s) > _MAX_NUMERAL_DIGITS:
        return None
    for pattern in (_FRACTION, _LATEX_FRACTION, _LATEX_FRACTION_SHORT):
        m = pattern.match(s)
        if m:
            sign, num, den = m.groups()
            if int(den) == 0:
                return None
            value = Fraction(int(num), int(den))
            return -value if sign == "-" else value
    m = _DECIMAL.match(s)
    if m and (m.group(2) or m.group(3)):
        sign, whole, frac = m.groups()
        whole = (whole or "0").replace(",", "")
        value = Fraction(int(whole))
        if frac:
            value += Fraction(int(frac), 10 ** len(frac))
        return -value if sign == "-" else value
    return None


def _format_fraction(value: Fraction) -> str:
    return str(value.numerator) if value.denominator == 1 else f"{value.numerator}/{value.denominator}"


# ------------------------------------------------------------------ screening
def _nesting_depth(s: str) -> int:
    depth = best = 0
    for ch in s:
        if ch in "({[":
            depth += 1
            best = max(best, depth)
        elif ch in ")}]":
            depth = max(0, depth - 1)
    return best


def _operand_after(s: str, i: int) -> str:
    """The operand that starts at ``s[i]``: a balanced group or a run of word characters."""
    while i < len(s) and s[i] == " ":
        i += 1
    if i < len(s) and s[i] in "({[":
        depth = 0
        for j in range(i, len(s)):
            if s[j] in "({[":
                depth += 1
            elif s[j] in ")}]":
                depth -= 1
                if depth == 0:
                    return s[i + 1 : j]
        return s[i + 1 :]
    j = i
    if j < len(s) and s[j] in "+-":
        j += 1
    while j < len(s) and (s[j].isalnum() or s[j] in "._\\"):
        j += 1
    return s[i:j]


def _operand_before(s: str, i: int) -> str:
    """The operand that ends just before ``s[i]``: a balanced group or a run of word characters."""
    j = i
    while j > 0 and s[j - 1] == " ":
        j -= 1
    if j > 0 and s[j - 1] in ")}]":
        depth = 0
        for k in range(j - 1, -1, -1):
            if s[k] in ")}]":
                depth += 1
            elif s[k] in "({[":
                depth -= 1
                if depth == 0:
                    return s[k + 1 : j - 1]
        return s[: j - 1]
    k = j
    while k > 0 and (s[k - 1].isalnum() or s[k - 1] in "._"):
        k -= 1
    return s[k:j]


def _magnitude(expr: str) -> int:
    """A crude upper estimate of an operand's size: the product of its integer literals."""
    product = 1
    for literal in _INT_LITERAL.findall(expr):
        if len(literal) > 12:
            return 10**13
        product *= max(1, int(literal))
        if product > 10**13:
            return product
    return product


def _explosive(s: str) -> bool:
    """Whether sympy might build or evaluate a gigantic number from ``s``."""
    for m in re.finditer(r"\^|\*\*", s):
        exponent = _operand_after(s, m.end())
        if "^" in exponent or "**" in exponent or "!" in exponent or _magnitude(exponent) > _MAX_EXPONENT:
            return True
    if _COMBINATORIAL.search(s) and ("^" in s or "**" in s):
        return True  # binomials/factorials of powers: sizes cannot be bounded cheaply
    if _DANGEROUS_WORDS.search(s):
        for m in re.finditer(r"!", s):
            operand = _operand_before(s, m.start())
            if "^" in operand or "**" in operand or "!" in operand or _magnitude(operand) > _MAX_FACTORIAL:
                return True
        if any(len(x) > 6 or int(x) > _MAX_COMBINATORIAL_LITERAL for x in _INT_LITERAL.findall(s)):
            return True
    return False


def _symbolic_ok(s: str) -> bool:
    return 0 < len(s) <= MAX_SYMBOLIC_CHARS and _nesting_depth(s) <= MAX_NESTING and not _explosive(s)


# --------------------------------------------------------------------- public
def grade_answer(predicted: Any, gold: Any, *, mode: str = "math-verify", timeout_s: float = 3.0) -> bool:
    """Whether ``predicted`` is mathematically equivalent to ``gold``.

    Args:
        predicted: the model's final answer (the content of its ``\\boxed{}``;
            a full response with ``<answer>``/``\\boxed{}`` also works).
        gold: the reference answer, in text or LaTeX.
        mode: "math-verify" (default: verl's math-verify semantics) or "strict"
            (plain numbers compared as exact rationals); see the module docstring.
        timeout_s: CPU-time bound on the symbolic stage (its wall-clock wait is capped at
            ``_grading_worker.WALL_FACTOR`` × that).

    Returns:
        True when equivalent (see the module docstring for the rules); False
        otherwise, including for non-string, empty, unparsable, oversized or
        too-slow inputs. Never raises for any ``predicted``/``gold``.

    Raises:
        EnvSetupError: the symbolic stage needs a grading worker and none can be started.
        ValueError: ``mode`` is not one of :data:`GRADING_MODES` (a caller's error, not the model's).
    """
    if mode not in GRADING_MODES:
        raise ValueError(f"mode must be one of {GRADING_MODES}, got {mode!r}")
    strict = mode == "strict"
    try:
        if not isinstance(predicted, str) or not isinstance(gold, str):
            return False
        if len(predicted) > MAX_INPUT_CHARS or len(gold) > MAX_INPUT_CHARS:
            return False
        pred_norm = normalize_answer(predicted)
        gold_norm = normalize_answer(gold)
        if not pred_norm or not gold_norm:
            return False
        if pred_norm == gold_norm:
            return True
        pred_num = parse_plain_number(pred_norm)
        gold_num = parse_plain_number(gold_norm)
        if pred_num is not None and gold_num is not None and (strict or pred_num == gold_num):
            return pred_num == gold_num
        pred_text, gold_text = _unwrap(predicted), _unwrap(gold)
        if not (_symbolic_ok(pred_text) and _symbolic_ok(gold_text)):
            return False
        return symbolic_verdict(pred_text, gold_text, strict=strict, timeout_s=timeout_s) is True
    except EnvSetupError:
        raise  # the grading worker cannot start: a broken install, not an answer
    except Exception:  # noqa: BLE001 - the contract is "never raises" for any input
        return False
