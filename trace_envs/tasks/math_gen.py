"""The offline default math task set: seeded, generated word problems where computing helps.

Every problem comes from a *family* (divisor counts, totients, modular
inverses, lattice paths with obstacles, ...) at a *level*:

* level 1 — small numbers, doable mentally or on paper;
* level 2 — tedious by hand, quick with a few lines of code;
* level 3 — sizes where writing code is the realistic way (huge exponents,
  ranges of 10^5 numbers, 10^12-sized inputs, big grids).

Answers are correct by construction: each is computed by the reference
implementation in this module (tests cross-check them against brute force on
small levels and against each task's ``solution_code`` on all levels).
Generation is deterministic: the same ``(n, seed, levels, families)`` give the
same tasks on every machine and Python version (no ``hash()``, no global RNG).

``Task.data`` holds:

* ``"answer"``: the canonical answer string (an integer like ``"42"``, a
  reduced fraction like ``"3/7"``, or base-b digits like ``"20112"``);
* ``"family"`` and ``"level"``;
* ``"params"``: the problem's parameters (JSON-serialisable);
* ``"solution_code"``: a short stdlib-only Python program that prints the answer.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache
from typing import Any

from trace_envs.core import Task, TaskSet

__all__ = [
    "MATH_FAMILIES",
    "ANSWER_INSTRUCTION",
    "generate_math_tasks",
    "default_math_tasks",
    "DEFAULT_SPLIT_SIZES",
]

ANSWER_INSTRUCTION = "Put your final answer in <answer>\\boxed{...}</answer>."

#: Tasks in each split of :func:`default_math_tasks`.
DEFAULT_SPLIT_SIZES = {"train": 300, "test": 100}
_SPLIT_SEEDS = {"train": 0, "test": 1}

_SIEVE_LIMIT = 2_000_000


@dataclass(frozen=True)
class _Problem:
    question: str
    answer: str
    code: str
    params: dict[str, Any]


# ------------------------------------------------------------- number theory
@lru_cache(maxsize=1)
def _sieve() -> bytearray:
    """is_prime[k] for 0 <= k <= _SIEVE_LIMIT (built once, ~0.1 s)."""
    is_prime = bytearray([1]) * (_SIEVE_LIMIT + 1)
    is_prime[0] = is_prime[1] = 0
    for p in range(2, math.isqrt(_SIEVE_LIMIT) + 1):
        if is_prime[p]:
            is_prime[p * p :: p] = bytes(len(range(p * p, _SIEVE_LIMIT + 1, p)))
    return is_prime


@lru_cache(maxsize=1)
def _small_primes() -> tuple[int, ...]:
    return tuple(p for p in range(2, 1000) if _sieve()[p])


@lru_cache(maxsize=1)
def _medium_primes() -> tuple[int, ...]:
    return tuple(p for p in range(1009, 100_000, 2) if _sieve()[p])


def _factorize(n: int) -> dict[int, int]:
    """Prime factorisation by trial division (fast for the numbers generated here)."""
    factors: dict[int, int] = {}
    p = 2
    while p * p <= n:
        while n % p == 0:
            factors[p] = factors.get(p, 0) + 1
            n //= p
        p += 1 if p == 2 else 2
    if n > 1:
        factors[n] = factors.get(n, 0) + 1
    return factors


def _structured_number(rng: random.Random, low: int, high: int, *, big_prime: bool = False) -> int:
    """A number in [low, high] with several small prime factors (and maybe one prime in 10^3..10^5)."""
    for _ in range(1000):
        n = 1
        if big_prime:
            n = rng.choice(_medium_primes())
        while n < low:
            n *= rng.choice(_small_primes()[:12])
        if n <= high:
            return n
    return rng.randint(low, high)


def _ext_inverse(a: int, m: int) -> int:
    """a^-1 mod m by the extended Euclidean algorithm (gcd(a, m) must be 1)."""
    old_r, r, old_s, s = a % m, m, 1, 0
    while r:
        q = old_r // r
        old_r, r = r, old_r - q * r
        old_s, s = s, old_s - q * s
    if old_r != 1:
        raise ValueError(f"{a} has no inverse modulo {m}")
    return old_s % m


def _fib_pair(n: int, m: int) -> tuple[int, int]:
    """(F_n mod m, F_{n+1} mod m) by fast doubling."""
    if n == 0:
        return 0, 1 % m
    a, b = _fib_pair(n // 2, m)
    c = a * ((2 * b - a) % m) % m
    d = (a * a + b * b) % m
    return (d, (c + d) % m) if n % 2 else (c, d)


def _legendre(n: int, p: int) -> int:
    total = 0
    while n:
        n //= p
        total += n
    return total


def _digit_sum_count(limit: int, target: int) -> int:
    """How many integers in [1, limit] have digit sum ``target`` (digit DP)."""
    digits = [int(c) for c in str(limit)]

    @cache
    def count(pos: int, remaining: int, tight: bool) -> int:
        if remaining < 0:
            return 0
        if pos == len(digits):
            return int(remaining == 0)
        top = digits[pos] if tight else 9
        return sum(count(pos + 1, remaining - d, tight and d == top) for d in range(top + 1))

    return count(0, target, True) - int(target == 0)  # drop the number 0


def _to_base(n: int, base: int) -> str:
    out = []
    while n:
        n, d = divmod(n, base)
        out.append(str(d))
    return "".join(reversed(out)) or "0"


def _frac(num: int, den: int) -> str:
    g = math.gcd(num, den)
    num, den = num // g, den // g
    return str(num) if den == 1 else f"{num}/{den}"


# ------------------------------------------------------------------ families
def _divisor_count(rng: random.Random, level: int) -> _Problem:
    n = [lambda: rng.randint(12, 100), lambda: rng.randint(1_000, 100_000),
         lambda: _structured_number(rng, 10**10, 10**13)][level - 1]()
    answer = math.prod(e + 1 for e in _factorize(n).values())
    code = (f"n, r, p = {n}, 1, 2\nwhile p * p <= n:\n    e = 0\n    while n % p == 0:\n"
            "        n //= p\n        e += 1\n    r *= e + 1\n    p += 1\nif n > 1:\n    r *= 2\nprint(r)")
    return _Problem(f"How many positive divisors does {n} have?", str(answer), code, {"n": n})


def _divisor_sum(rng: random.Random, level: int) -> _Problem:
    n = [lambda: rng.randint(6, 60), lambda: rng.randint(1_000, 50_000),
         lambda: _structured_number(rng, 10**9, 10**12, big_prime=True)][level - 1]()
    answer = math.prod((p ** (e + 1) - 1) // (p - 1) for p, e in _factorize(n).items())
    code = (f"n, r, p = {n}, 1, 2\nwhile p * p <= n:\n    t = 1\n    while n % p == 0:\n"
            "        n //= p\n        t = t * p + 1\n    r *= t\n    p += 1\nif n > 1:\n    r *= n + 1\nprint(r)")
    return _Problem(f"What is the sum of all positive divisors of {n} (including 1 and {n} itself)?",
                    str(answer), code, {"n": n})


def _totient(rng: random.Random, level: int) -> _Problem:
    n = [lambda: rng.randint(10, 50), lambda: rng.randint(1_000, 100_000),
         lambda: _structured_number(rng, 10**10, 10**13, big_prime=True)][level - 1]()
    answer = n
    for p in _factorize(n):
        answer = answer // p * (p - 1)
    code = (f"n = m = {n}\nr, p = n, 2\nwhile p * p <= m:\n    if m % p == 0:\n        r -= r // p\n"
            "        while m % p == 0:\n            m //= p\n    p += 1\nif m > 1:\n    r -= r // m\nprint(r)")
    return _Problem(f"How many integers k with 1 <= k <= {n} satisfy gcd(k, {n}) = 1?",
                    str(answer), code, {"n": n})


def _prime_count(rng: random.Random, level: int) -> _Problem:
    if level == 1:
        a = rng.randint(1, 30)
        b = a + rng.randint(10, 30)
    elif level == 2:
        a = rng.randint(100, 5_000)
        b = a + rng.randint(500, 5_000)
    else:
        a = rng.randint(10**6, 15 * 10**5)
        b = a + rng.randint(50_000, 400_000)
    answer = sum(_sieve()[a : b + 1])
    code = (f"a, b = {a}, {b}\ns = bytearray([1]) * (b + 1)\ns[0] = s[1] = 0\n"
            "for p in range(2, int(b ** 0.5) + 1):\n    if s[p]:\n        s[p * p :: p] = bytes(len(s[p * p :: p]))\n"
            "print(sum(s[a:]))")
    return _Problem(f"How many prime numbers p satisfy {a} <= p <= {b}?", str(answer), code, {"a": a, "b": b})


def _digit_sum_power(rng: random.Random, level: int) -> _Problem:
    a, b = [lambda: (rng.randint(2, 3), rng.randint(4, 12)), lambda: (rng.randint(2, 9), rng.randint(15, 40)),
            lambda: (rng.randint(2, 99), rng.randint(200, 1500))][level - 1]()
    answer = sum(map(int, str(a**b)))
    return _Problem(f"What is the sum of the decimal digits of {a}^{b}?", str(answer),
                    f"print(sum(int(c) for c in str({a} ** {b})))", {"a": a, "b": b})


def _modpow(rng: random.Random, level: int) -> _Problem:
    a, b, m = [lambda: (rng.randint(2, 9), rng.randint(2, 5), rng.randint(5, 13)),
               lambda: (rng.randint(10, 99), rng.randint(20, 200), rng.randint(100, 999)),
               lambda: (rng.randint(10**5, 10**7), rng.randint(10**15, 10**18), rng.randint(10**8, 10**9))][level - 1]()
    return _Problem(f"What is the remainder when {a}^{b} is divided by {m}?", str(pow(a, b, m)),
                    f"print(pow({a}, {b}, {m}))", {"a": a, "b": b, "m": m})


def _mod_inverse(rng: random.Random, level: int) -> _Problem:
    m = [lambda: rng.choice([5, 7, 11, 13]), lambda: rng.randint(100, 1_000),
         lambda: rng.randint(10**9, 10**12)][level - 1]()
    while True:
        a = rng.randint(2, m - 1)
        if math.gcd(a, m) == 1:
            break
    answer = _ext_inverse(a, m)
    return _Problem(f"Find the integer x with 1 <= x < {m} such that {a} * x leaves remainder 1 when divided by {m}.",
                    str(answer), f"print(pow({a}, -1, {m}))", {"a": a, "m": m})


def _crt(rng: random.Random, level: int) -> _Problem:
    pool, k = [([2, 3, 5, 7], 2), ([3, 4, 5, 7, 11, 13, 17, 19, 23], 3),
               ([p for p in range(1_000, 30_000) if _sieve()[p]], 4)][level - 1]
    while True:
        moduli = sorted(rng.sample(pool, k))
        if all(math.gcd(x, y) == 1 for i, x in enumerate(moduli) for y in moduli[i + 1 :]):
            break
    residues = [rng.randint(0, m - 1) for m in moduli]
    big = math.prod(moduli)
    x = sum(r * (big // m) * _ext_inverse(big // m, m) for r, m in zip(residues, moduli)) % big
    answer = x or big
    conditions = ", ".join(f"x ≡ {r} (mod {m})" for r, m in zip(residues, moduli))
    code = (f"rs, ms = {residues}, {moduli}\nx, M = 0, 1\nfor r, m in zip(rs, ms):\n"
            "    x += M * ((r - x) * pow(M, -1, m) % m)\n    M *= m\nprint(x % M or M)")
    return _Problem(f"Find the smallest positive integer x such that {conditions}.", str(answer), code,
                    {"residues": residues, "moduli": moduli})


def _binomial(rng: random.Random, level: int) -> _Problem:
    if level < 3:
        n = rng.randint(5, 10) if level == 1 else rng.randint(20, 40)
        k = rng.randint(2, n // 2)
        return _Problem(f"In how many ways can a committee of {k} people be chosen from {n} people?",
                        str(math.comb(n, k)), f"import math\nprint(math.comb({n}, {k}))", {"n": n, "k": k})
    n = rng.randint(10_000, 50_000)
    k = rng.randint(n // 5, n // 2)
    m = 10**9 + 7
    return _Problem(f"What is the remainder when the binomial coefficient C({n}, {k}) is divided by {m}?",
                    str(math.comb(n, k) % m), f"import math\nprint(math.comb({n}, {k}) % {m})",
                    {"n": n, "k": k, "m": m})


def _derangements(rng: random.Random, level: int) -> _Problem:
    n = [lambda: rng.randint(3, 6), lambda: rng.randint(7, 10), lambda: rng.randint(12, 25)][level - 1]()
    story = rng.choice(_DERANGEMENT_STORIES).format(n=n)
    d = [1, 0]
    for i in range(2, n + 1):
        d.append((i - 1) * (d[-1] + d[-2]))
    code = f"a, b = 1, 0\nfor i in range(2, {n} + 1):\n    a, b = b, (i - 1) * (a + b)\nprint(b)"
    return _Problem(story, str(d[n]), code, {"n": n})


_DERANGEMENT_STORIES = (
    "{n} guests each leave a coat at a party. In how many ways can the coats be handed back, one per guest, "
    "so that no guest receives their own coat?",
    "{n} letters are put into {n} addressed envelopes, one letter per envelope. In how many ways can this be done "
    "so that no letter is in its correct envelope?",
    "{n} students swap their tests for peer grading: each student grades exactly one test and each test is graded "
    "once. In how many ways can the tests be handed out so that nobody grades their own test?",
    "In how many ways can the numbers 1, 2, ..., {n} be arranged in a row so that no number k is in position k?",
)


def _lattice_paths(rng: random.Random, level: int) -> _Problem:
    width, height, n_blocked = [(rng.randint(2, 3), rng.randint(2, 3), 1), (rng.randint(4, 6), rng.randint(4, 6), 3),
                                (rng.randint(14, 20), rng.randint(14, 20), rng.randint(8, 14))][level - 1]
    cells = [(x, y) for x in range(width + 1) for y in range(height + 1) if (x, y) not in ((0, 0), (width, height))]
    while True:
        blocked = sorted(rng.sample(cells, n_blocked))
        ways = [[0] * (height + 1) for _ in range(width + 1)]
        for x in range(width + 1):
            for y in range(height + 1):
                if (x, y) in blocked:
                    continue
                ways[x][y] = 1 if (x, y) == (0, 0) else (ways[x - 1][y] if x else 0) + (ways[x][y - 1] if y else 0)
        if ways[width][height]:
            break
    points = ", ".join(f"({x}, {y})" for x, y in blocked)
    code = (f"W, H, B = {width}, {height}, {{{points}}}\nw = {{}}\nfor x in range(W + 1):\n    for y in range(H + 1):\n"
            "        w[x, y] = 0 if (x, y) in B else 1 if x == y == 0 else w.get((x - 1, y), 0) + w.get((x, y - 1), 0)\n"
            "print(w[W, H])")
    return _Problem(f"A token starts at (0, 0) and moves to ({width}, {height}) in unit steps, each step increasing "
                    f"either x or y by 1. It may never visit the blocked points {points}. "
                    "How many different paths are there?", str(ways[width][height]), code,
                    {"width": width, "height": height, "blocked": [list(p) for p in blocked]})


def _count_divisible(rng: random.Random, level: int) -> _Problem:
    n = [lambda: rng.randint(30, 60), lambda: rng.randint(1_000, 10_000), lambda: rng.randint(10**11, 10**13)][level - 1]()
    hi = [6, 20, 200][level - 1]
    while True:
        a, b, c = (rng.randint(2, hi) for _ in range(3))
        if len({a, b, c}) == 3 and a % c and b % c:
            break
    lcm = math.lcm
    in_ab = n // a + n // b - n // lcm(a, b)
    in_ab_c = n // lcm(a, c) + n // lcm(b, c) - n // lcm(a, b, c)
    code = f"print(sum(1 for k in range(1, {n} + 1) if (k % {a} == 0 or k % {b} == 0) and k % {c}))"
    if level == 3:
        code = (f"from math import lcm\nn, a, b, c = {n}, {a}, {b}, {c}\n"
                "print(n//a + n//b - n//lcm(a, b) - (n//lcm(a, c) + n//lcm(b, c) - n//lcm(a, b, c)))")
    return _Problem(f"How many integers k with 1 <= k <= {n} are divisible by {a} or by {b}, but not by {c}?",
                    str(in_ab - in_ab_c), code, {"n": n, "a": a, "b": b, "c": c})


def _digit_sum_count_family(rng: random.Random, level: int) -> _Problem:
    n = [lambda: rng.randint(50, 100), lambda: rng.randint(1_000, 10_000), lambda: rng.randint(10**10, 10**13)][level - 1]()
    s = rng.randint(3, [9, 20, 60][level - 1])
    answer = _digit_sum_count(n, s)
    code = (f"from functools import lru_cache\nD = [int(c) for c in str({n})]\n@lru_cache(None)\n"
            "def f(i, r, t):\n    if r < 0:\n        return 0\n    if i == len(D):\n        return int(r == 0)\n"
            "    top = D[i] if t else 9\n    return sum(f(i + 1, r - d, t and d == top) for d in range(top + 1))\n"
            f"print(f(0, {s}, True))")
    return _Problem(f"How many integers k with 1 <= k <= {n} have decimal digits that add up to {s}?",
                    str(answer), code, {"n": n, "s": s})


def _power_sum(rng: random.Random, level: int) -> _Problem:
    n, p = [lambda: (rng.randint(5, 10), rng.randint(1, 2)), lambda: (rng.randint(30, 100), rng.randint(2, 3)),
            lambda: (rng.randint(10_000, 100_000), rng.randint(3, 7))][level - 1]()
    answer = sum(k**p for k in range(1, n + 1))
    return _Problem(f"Compute 1^{p} + 2^{p} + 3^{p} + ... + {n}^{p}.", str(answer),
                    f"print(sum(k ** {p} for k in range(1, {n} + 1)))", {"n": n, "p": p})


def _base_conversion(rng: random.Random, level: int) -> _Problem:
    n, b = [lambda: (rng.randint(9, 63), 2), lambda: (rng.randint(500, 10_000), rng.randint(3, 9)),
            lambda: (rng.randint(10**12, 10**15), rng.randint(3, 9))][level - 1]()
    code = f"n, s = {n}, ''\nwhile n:\n    n, d = divmod(n, {b})\n    s = str(d) + s\nprint(s)"
    return _Problem(f"Write the decimal number {n} in base {b}. Give the base-{b} digits only, "
                    "most significant first.", _to_base(n, b), code, {"n": n, "base": b})


def _coprime_probability(rng: random.Random, level: int) -> _Problem:
    n, m = [lambda: (rng.randint(10, 20), rng.choice([4, 6, 9, 10, 12])),
            lambda: (rng.randint(200, 1_000), rng.randint(30, 300)),
            lambda: (rng.randint(10**9, 10**12), _structured_number(rng, 10**5, 10**7, big_prime=True))][level - 1]()
    primes = list(_factorize(m))
    good = 0
    for mask in range(1 << len(primes)):
        chosen = [p for i, p in enumerate(primes) if mask >> i & 1]
        good += (-1) ** len(chosen) * (n // math.prod(chosen))
    code = (f"from fractions import Fraction\nn, m = {n}, {m}\nps, q, p = [], m, 2\nwhile p * p <= q:\n"
            "    if q % p == 0:\n        ps.append(p)\n        while q % p == 0:\n            q //= p\n    p += 1\n"
            "if q > 1:\n    ps.append(q)\ngood = 0\nfor mask in range(1 << len(ps)):\n    d, s = 1, 1\n"
            "    for i, p in enumerate(ps):\n        if mask >> i & 1:\n            d, s = d * p, -s\n    good += s * (n // d)\n"
            "f = Fraction(good, n)\nprint(f.numerator if f.denominator == 1 else f)")
    return _Problem(f"An integer k is chosen uniformly at random from 1, 2, ..., {n}. What is the probability that "
                    f"gcd(k, {m}) = 1? Give the answer as a reduced fraction.", _frac(good, n), code,
                    {"n": n, "m": m})


def _fibonacci(rng: random.Random, level: int) -> _Problem:
    if level < 3:
        n = rng.randint(8, 20) if level == 1 else rng.randint(40, 90)
        return _Problem(f"The Fibonacci numbers are F_1 = F_2 = 1 and F_(k+1) = F_k + F_(k-1). What is F_{n}?",
                        str(_fib_pair(n, 10**30)[0]),
                        f"a, b = 0, 1\nfor _ in range({n}):\n    a, b = b, a + b\nprint(a)", {"n": n})
    n, m = rng.randint(10**15, 10**18), rng.randint(10**6, 10**9)
    code = (f"def f(n, m):\n    if n == 0:\n        return 0, 1\n    a, b = f(n // 2, m)\n    c = a * (2 * b - a) % m\n"
            f"    d = (a * a + b * b) % m\n    return (d, (c + d) % m) if n % 2 else (c, d)\nprint(f({n}, {m})[0])")
    return _Problem(f"The Fibonacci numbers are F_1 = F_2 = 1 and F_(k+1) = F_k + F_(k-1). "
                    f"What is the remainder when F_{n} is divided by {m}?", str(_fib_pair(n, m)[0]), code,
                    {"n": n, "m": m})


def _factorial_zeros(rng: random.Random, level: int) -> _Problem:
    n, b = [lambda: (rng.randint(10, 30), 10), lambda: (rng.randint(100, 1_000), rng.choice([10, 2, 6, 12])),
            lambda: (rng.randint(10**11, 10**14), rng.choice([12, 18, 20, 45, 72, 98, 100]))][level - 1]()
    answer = min(_legendre(n, p) // e for p, e in _factorize(b).items())
    code = (f"n, b = {n}, {b}\nbest, q, p = None, b, 2\nwhile q > 1:\n    e = 0\n    while q % p == 0:\n"
            "        q //= p\n        e += 1\n    if e:\n        t, m = 0, n\n        while m:\n            m //= p\n"
            "            t += m\n        best = t // e if best is None else min(best, t // e)\n    p += 1\nprint(best)")
    where = "in base 10" if b == 10 else f"when written in base {b}"
    return _Problem(f"How many trailing zeros does {n}! (the factorial of {n}) have {where}?", str(answer), code,
                    {"n": n, "base": b})


_FAMILIES: dict[str, Callable[[random.Random, int], _Problem]] = {
    "divisor_count": _divisor_count,
    "divisor_sum": _divisor_sum,
    "totient": _totient,
    "prime_count": _prime_count,
    "digit_sum_power": _digit_sum_power,
    "modpow": _modpow,
    "mod_inverse": _mod_inverse,
    "crt": _crt,
    "binomial": _binomial,
    "derangements": _derangements,
    "lattice_paths": _lattice_paths,
    "count_divisible": _count_divisible,
    "digit_sum_count": _digit_sum_count_family,
    "power_sum": _power_sum,
    "base_conversion": _base_conversion,
    "coprime_probability": _coprime_probability,
    "fibonacci": _fibonacci,
    "factorial_zeros": _factorial_zeros,
}

#: The family names, in generation order.
MATH_FAMILIES: tuple[str, ...] = tuple(_FAMILIES)


# -------------------------------------------------------------------- public
def _task_rng(seed: int, index: int, attempt: int) -> random.Random:
    digest = hashlib.sha256(f"trace-gym/math/{seed}/{index}/{attempt}".encode()).digest()
    return random.Random(int.from_bytes(digest[:8], "big"))


def _generate(n: int, seed: int, levels: Sequence[int], families: Sequence[str], id_prefix: str,
              exclude_prompts: Iterable[str] = ()) -> list[Task]:
    seen = set(exclude_prompts)
    tasks: list[Task] = []
    combos = [(f, lv) for lv in levels for f in families]
    for index in range(n):
        family, level = combos[index % len(combos)]
        for attempt in range(100):
            problem = _FAMILIES[family](_task_rng(seed, index, attempt), level)
            prompt = f"{problem.question}\n\n{ANSWER_INSTRUCTION}"
            if prompt not in seen:
                break
        else:  # pragma: no cover - only for pathological (n, families, levels) that exhaust a small family
            raise ValueError(f"cannot generate {n} distinct problems from families={list(families)} levels={list(levels)}")
        seen.add(prompt)
        data = {"answer": problem.answer, "family": family, "level": level, "params": problem.params,
                "solution_code": problem.code}
        tasks.append(Task(task_id=f"{id_prefix}-{index:04d}", prompt=prompt, data=data))
    return tasks


def generate_math_tasks(
    n: int,
    *,
    seed: int = 0,
    levels: Sequence[int] = (1, 2, 3),
    families: Sequence[str] | None = None,
    id_prefix: str | None = None,
) -> list[Task]:
    """``n`` distinct generated math problems, deterministic in all arguments.

    Problems cycle through every (level, family) pair in order — family fastest —
    so each pair is equally represented; parameters are drawn from an RNG seeded
    by ``(seed, index)``. Prompts within one call are distinct.

    Args:
        n: how many tasks (>= 0).
        seed: the generation seed.
        levels: difficulty levels to use, each 1, 2 or 3.
        families: family names from :data:`MATH_FAMILIES` (None: all).
        id_prefix: task ids are ``f"{id_prefix}-{index:04d}"`` (default ``f"math-s{seed}"``).

    Raises:
        ValueError: unknown family, a level outside 1..3, empty ``levels``/``families`` or ``n < 0``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    families = MATH_FAMILIES if families is None else tuple(families)
    levels = tuple(levels)
    unknown = [f for f in families if f not in _FAMILIES]
    if unknown:
        raise ValueError(f"unknown math families {unknown}; choose from {list(MATH_FAMILIES)}")
    if not families or not levels:
        raise ValueError("families and levels must not be empty")
    bad = [lv for lv in levels if lv not in (1, 2, 3)]
    if bad:
        raise ValueError(f"levels must be 1, 2 or 3, got {bad}")
    return _generate(n, seed, levels, families, id_prefix if id_prefix is not None else f"math-s{seed}")


def default_math_tasks(split: str = "train") -> TaskSet:
    """The built-in offline task set: 300 ``"train"`` or 100 ``"test"`` problems.

    Ids are ``"math-train-0007"`` / ``"math-test-0042"``; the set is named
    ``"math-default-<split>"``. The splits use different seeds and no test
    prompt equals a train prompt. Stable across runs and machines. A
    :class:`~trace_envs.tasks.splits.SplitTaskSet`: looking up the id of the other split's problem
    raises :class:`~trace_envs.errors.TaskNotFoundError` naming the split that holds it.

    Raises:
        ValueError: ``split`` is not "train" or "test".
    """
    if split not in DEFAULT_SPLIT_SIZES:
        raise ValueError(f"split must be one of {list(DEFAULT_SPLIT_SIZES)}, got {split!r}")
    exclude: list[str] = []
    if split == "test":
        exclude = [t.prompt for t in _generate(DEFAULT_SPLIT_SIZES["train"], _SPLIT_SEEDS["train"], (1, 2, 3),
                                               MATH_FAMILIES, "math-train")]
    tasks = _generate(DEFAULT_SPLIT_SIZES[split], _SPLIT_SEEDS[split], (1, 2, 3), MATH_FAMILIES,
                      f"math-{split}", exclude)
    from trace_envs.tasks.splits import SplitTaskSet

    # the other split's ids are "math-<other>-0000".. (one per problem): a lookup of one names its split
    elsewhere = {f"math-{other}-{i:04d}": other for other, size in DEFAULT_SPLIT_SIZES.items() if other != split
                 for i in range(size)}
    return SplitTaskSet(tasks, name=f"math-default-{split}", split=split, elsewhere=elsewhere, all_name=None)
