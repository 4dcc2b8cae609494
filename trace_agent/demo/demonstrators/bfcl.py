"""BFCL-v0's demonstrator: the task's ground truth, with a plausible mistake at a *later* user turn.

A clean demonstration replays the entry's ground truth (the env's executed ``ground_truth()``,
one step with the user turn's calls as a Python-style list, then "Done." to end the turn). A flawed one
replays turns ``0 .. t-1`` correctly and makes one mistake in user turn ``t >= 1`` (the rest is
replayed as written), so the outcome is still open after the first turn:

* ``wrong_argument``: one argument of one call of turn ``t`` takes a plausible wrong value (a string
  the task uses elsewhere, such as an earlier turn's folder or file name; a number off by one; a
  flipped flag; a list without its last item);
* ``missing_call``: the last call of turn ``t`` is left out (a one-call turn ends with no call);
* ``stale_call``: the calls act on stale state: in a turn of several calls the first (the one that
  moves the state on, e.g. ``cd``, ``authenticate_*``) is left out so the others run on the state before
  it; in a one-call turn the previous turn's calls are repeated instead.

BFCL's checker fails each of these wherever the mistake changes a backend's state or a call's
result (checked against the real env in ``tests/agent/demo/test_demo_bfcl.py``; a few, such as a
wrong argument to a read-only call that returns the same text, still pass and are recorded with
their real reward). Demonstrated tasks: the category's ``train`` split (never a test entry), entries
with at least two user turns and a ground-truth call after the first turn (multi_turn_base: 147 of
150 train entries, 2-7 user turns, 4-14 env steps).

The demos are played with ``tool_detail="names"`` (:attr:`BFCLDemonstrator.env_kwargs`: the tools are
listed by name only): a tiny model cannot read BFCL's schemas, which are most of a full context.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np

from trace_agent.demo.profiles import BFCL

if TYPE_CHECKING:
    from trace_agent.demo.demonstrators.base import Demonstration
    from trace_envs.actions import PythonCall
    from trace_envs.core import BranchableEnv, Task, TaskSet

__all__ = ["BFCLDemonstrator", "FLAW_KINDS", "FlawPlan", "flawed_turns", "call_string_arguments", "rename_names",
           "spelled_names", "made_up_word", "made_up_words"]

#: The kinds of mistake a flawed demonstration makes (see the module docstring).
FLAW_KINDS: tuple[str, ...] = ("wrong_argument", "missing_call", "stale_call")


@dataclass(frozen=True, kw_only=True)
class FlawPlan:
    """Which user turn of an episode goes wrong and how (``turn`` None: a clean episode)."""

    turn: int | None = None
    kind: str | None = None
    #: which call of the turn and which of its arguments ``wrong_argument`` changes, and to what
    call_index: int = 0
    argument: str | None = None
    value: Any = None

    def __post_init__(self) -> None:
        if (self.turn is None) != (self.kind is None):
            raise ValueError("a FlawPlan names both a turn and a kind, or neither")
        if self.kind is not None and self.kind not in FLAW_KINDS:
            raise ValueError(f"unknown flaw kind {self.kind!r}; choose one of {', '.join(FLAW_KINDS)}")
        if self.turn is not None and self.turn < 1:
            raise ValueError(f"a flaw is made after the first user turn (turn >= 1), got {self.turn}")


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, (list, tuple)):
        return [s for v in value for s in _strings(v)]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    return []


def wrong_value(value: Any, others: Sequence[str], rng: np.random.Generator) -> Any:
    """A plausible wrong value for an argument: another string of the task, a number off by one, a
    flipped flag, a list without its last item (or with a copy of its first); never ``value`` itself."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + int(rng.choice([-1, 1])) or value + 1
    if isinstance(value, float):
        return value + float(rng.choice([-1.0, 1.0]))
    if isinstance(value, str):
        pool = sorted({s for s in others if s != value and s})
        if pool:
            return pool[int(rng.integers(len(pool)))]
        return value + "_old" if value else "none"
    if isinstance(value, list):
        return value[:-1] if len(value) > 1 else (value + value if value else ["none"])
    return None if value is not None else "none"


def flawed_turns(turn_calls: Sequence[Sequence[PythonCall]], plan: FlawPlan) -> list[list[PythonCall]]:
    """The per-turn calls of an episode that follows ``plan`` (``turn_calls``: the ground truth's)."""
    from trace_envs.actions import PythonCall

    turns = [list(calls) for calls in turn_calls]
    if plan.turn is None:
        return turns
    t = plan.turn
    calls = turns[t]
    if plan.kind == "missing_call":
        turns[t] = calls[:-1]
    elif plan.kind == "stale_call":
        turns[t] = calls[1:] if len(calls) > 1 else [c for c in turns[t - 1]] or calls[:0]
    elif plan.kind == "wrong_argument":
        call = calls[plan.call_index]
        kwargs = dict(call.kwargs)
        kwargs[str(plan.argument)] = plan.value
        turns[t] = [*calls[:plan.call_index], PythonCall(call.name, (), kwargs), *calls[plan.call_index + 1:]]
    return turns


def call_string_arguments(text: str) -> list[str]:
    """The string arguments (and string items of list arguments) of a Python-style call list such as
    ``[cd(folder='temp'), grep(file_name='a.txt', pattern='x')]``; ``[]`` for any other text. Parsed by the
    env's own :func:`~trace_envs.actions.parse_call_list` (bounded, never evaluated)."""
    from trace_envs.actions import parse_call_list

    parsed = parse_call_list(text)
    if parsed.errors:
        return []
    found: list[str] = []
    for call in parsed.calls:
        for value in (*call.kwargs.values(), *call.args):
            items = value if isinstance(value, (list, tuple)) else [value]
            found += [v for v in items if isinstance(v, str)]
    return found


#: a name the augmentation may rename: no whitespace, 2-40 characters
_NAME = re.compile(r"\S{2,40}")


def _boundary_pattern(names: Sequence[str]) -> re.Pattern[str]:
    """Whole occurrences of ``names`` (longest first): not inside a longer word or file name, so ``report``
    matches in ``the report.`` and ``report/a.txt`` but not in ``report.txt`` or ``reports``."""
    alternation = "|".join(re.escape(n) for n in sorted(names, key=lambda n: (-len(n), n)))
    return re.compile(rf"(?<![\w.])({alternation})(?![\w]|\.\w)")


@functools.lru_cache(maxsize=4)
def _name_stems(category: str) -> tuple[str, ...]:
    """Word stems of the ``train`` split's string arguments (``final_report.pdf`` -> ``final``, ``report``): the
    parts renamed names are made of (no test entry contributes)."""
    from trace_envs.tasks.bfcl import bfcl_split

    stems: set[str] = set()
    for task in bfcl_split(category, "train").values():
        for turn in task.data["ground_truth"]:
            for call in turn:
                for value in call_string_arguments(f"[{call}]"):
                    if _NAME.fullmatch(value):
                        stem = value.rsplit(".", 1)[0] if "." in value[1:] else value
                        stems.update(w.lower() for w in re.split(r"[_\-.]+|(?<=[a-z])(?=[A-Z])", stem)
                                     if w.isalpha() and len(w) >= 2)
    return tuple(sorted(stems))


def _pick_words(words: Sequence[str], rng: np.random.Generator) -> list[str]:
    """One or two distinct draws of ``words`` (even odds): the words a fresh name is joined from."""
    return [words[int(i)] for i in rng.choice(len(words), size=int(rng.integers(1, 3)), replace=False)]


def _draws_stems(kind: str, rng: np.random.Generator) -> bool:
    """Whether a name of ``kind`` (:attr:`BFCLDemonstrator.RENAME_WORDS`) is made of the train split's stems:
    always for ``"stems"``, never for ``"made_up"``, at even odds for ``"mixed"``."""
    return kind == "stems" or (kind == "mixed" and rng.random() < 0.5)


def _new_name(old: str, stems: Sequence[str], rng: np.random.Generator) -> str:
    """A fresh name shaped like ``old``: one or two random stems, ``old``'s extension and capitalisation."""
    stem, dot, extension = old.rpartition(".") if "." in old[1:] else (old, "", "")
    words = _pick_words(stems, rng)
    if stem[:1].isupper():
        words = [w.capitalize() for w in words]
    return "_".join(words) + (dot + extension if dot else "")


_CONSONANTS, _VOWELS = "bdfgklmnprstvz", "aeiou"
_EXTENSIONS = ("", "", "", ".txt", ".pdf", ".csv", ".md", ".py", ".log")


def made_up_word(rng: np.random.Generator) -> str:
    """A pronounceable word of 2-3 random consonant-vowel syllables (``kovime``; 70² to 70³ of them): a word of the
    suite only by chance, so a tokenizer trained on the suite mostly spells it in short pieces that only copying
    can predict."""
    return "".join(_CONSONANTS[int(rng.integers(len(_CONSONANTS)))] + _VOWELS[int(rng.integers(len(_VOWELS)))]
                   for _ in range(int(rng.integers(2, 4))))


def made_up_words(rng: np.random.Generator, count: int = 40) -> list[str]:
    """``count`` draws of :func:`made_up_word`, sorted and without repeats: the words renamed names are made of."""
    return sorted({made_up_word(rng) for _ in range(count)})


def _drill_name(words: Sequence[str], rng: np.random.Generator) -> str:
    """A list drill's name of real words: one or two of ``words`` joined by ``_`` (a quarter capitalised), maybe
    with a file extension."""
    picked = _pick_words(words, rng)
    name = "_".join(w.capitalize() for w in picked) if rng.random() < 0.25 else "_".join(picked)
    return name + _EXTENSIONS[int(rng.integers(len(_EXTENSIONS)))]


def _tool_names(tools: Sequence[Mapping[str, Any]]) -> set[str]:
    """The function names of OpenAI-style tool schemas."""
    return {str(t.get("function", {}).get("name", "")) for t in tools if isinstance(t.get("function"), Mapping)}


def spelled_names(messages: Sequence[Mapping[str, Any]]) -> list[str]:
    """The string arguments of the assistant turns' calls (names: no whitespace, 2-40 characters) that one of the
    user turns spells, whole: the names a policy must copy from the user."""
    user = [str(m.get("content", "")) for m in messages if m.get("role") == "user"]
    arguments = {a for m in messages if m.get("role") == "assistant"
                 for a in call_string_arguments(str(m.get("content", ""))) if _NAME.fullmatch(a)}
    return [a for a in arguments if any(_boundary_pattern([a]).search(u) for u in user)]


def rename_names(messages: Sequence[Mapping[str, Any]], names: Sequence[str], stems: Sequence[str],
                 rng: np.random.Generator) -> tuple[tuple[Mapping[str, Any], ...], dict[str, str]]:
    """``messages`` with each of ``names`` renamed, one-to-one and consistently, in every non-system message
    (questions, calls, tool results); the new names are fresh (in no message). Returns the messages and the map."""
    names = sorted(set(names))
    if not names:
        return tuple(messages), {}
    text = "\n".join(str(m.get("content", "")) for m in messages)
    swap: dict[str, str] = {}
    for old in names:
        for _ in range(100):
            new = _new_name(old, stems, rng)
            if new not in text and new not in swap.values():
                swap[old] = new
                break
    if not swap:
        return tuple(messages), {}
    pattern = _boundary_pattern(list(swap))
    renamed = tuple({**m, "content": pattern.sub(lambda hit: swap[hit.group(1)], m["content"])}
                    if m.get("role") != "system" and isinstance(m.get("content"), str) else m for m in messages)
    return renamed, swap


class BFCLDemonstrator:
    """BFCL-v0: replay the ground truth; a flawed episode makes one mistake at a user turn >= 1.

    ``act`` draws the episode's :class:`FlawPlan` at its first step (turn uniform among the user
    turns >= 1 that have ground-truth calls; kind uniform among those that apply) and then returns
    the planned step for the number of assistant turns so far: one step of all the turn's calls (BFCL's
    Python-style list, keyword arguments: ``[cd(folder='temp'), ls()]``, 40% shorter than JSON blocks) and
    "Done.", per user turn; a turn left without calls is just "Done.".
    """

    env_id = BFCL
    #: ``gym.make`` arguments of the env the demos are played in (and the policy is meant for)
    env_kwargs: Mapping[str, Any] = {"tool_detail": "names"}
    #: :class:`~trace_agent.policy.hf.HFPolicy` settings the built policy needs (its ``trace_policy.json``):
    #: it renders any env's tools by name, as in its demonstrations
    policy_settings: Mapping[str, Any] = {"tool_detail": "names"}
    #: :class:`~trace_agent.demo.build.DemoTrainConfig` fields of BFCL-v0's demo policy
    #: (build K of docs/paper/bfcl/README.md: 300 first-turn steps of 16, then 1,200 whole-episode steps of 8;
    #: about 26 min on 2 CPU threads)
    train_overrides: Mapping[str, Any] = {
        "steps": 1200,
        "batch_size": 8,
        "first_turn_steps": 300,
        "learning_rate": 3e-3,
        "flawed_fraction": 0.35,
        "demos_per_task": 4,
        "max_turns": 20,
        "model": {"vocab_size": 2048, "hidden_size": 128, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2,
                  "head_dim": 32, "intermediate_size": 384, "max_position_embeddings": 4096},
    }

    #: where :meth:`augment`'s new names come from: ``"stems"``, the train split's word stems
    #: (``final_report.pdf`` -> ``budget_notes.pdf``), ``"made_up"``, :func:`made_up_word`s (``kovi_lamezu.pdf``),
    #: or ``"mixed"``, either of the two per augmented copy (even odds); ``drill_words`` takes the same values
    #: for the names of :meth:`copy_drills` (per drill)
    RENAME_WORDS: tuple[str, ...] = ("stems", "made_up", "mixed")

    def __init__(self, *, category: str = "multi_turn_base", num_tasks: int | None = 40,
                 rename_words: str = "stems", drill_words: str = "made_up") -> None:
        if num_tasks is not None and num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1 or None, got {num_tasks}")
        for setting, value in (("rename_words", rename_words), ("drill_words", drill_words)):
            if value not in self.RENAME_WORDS:
                raise ValueError(f"{setting} must be one of {', '.join(self.RENAME_WORDS)}, got {value!r}")
        self.category = category
        self.num_tasks = num_tasks
        self.rename_words = rename_words
        self.drill_words = drill_words
        self._script: list[str] = []
        self._plan = FlawPlan()

    def augment(self, demo: Demonstration, rng: np.random.Generator) -> Demonstration:
        """``demo`` with the names the user gives renamed: every string argument of the demonstration's calls
        that appears, whole, in one of its user turns (a file, folder, pattern or account name) gets a fresh
        name made of the train split's word stems (``rename_words="made_up"``: of :func:`made_up_word`s, which no
        model can guess without reading the question; ``"mixed"``: either, per copy), the same one in the questions, the calls and the tool
        results, so the episode stays consistent (its reward is kept) and the calls can only be right by
        copying the name from the question. Arguments the user does not spell out (canonical folder names,
        results read from the state) are kept.

        Not used by the shipped preset (``augment_copies: 0``): build M (docs/paper/bfcl/README.md, "Levers measured"),
        all 149 covered entries with 4 renamed copies of each demonstration, did not learn to copy at this
        model size (5 of 95 generated string arguments on held-out first turns are in the question)."""
        messages, _ = rename_names(demo.messages, spelled_names(demo.messages), self._words(self.rename_words, rng),
                                   rng)
        return replace(demo, messages=messages)

    def _words(self, kind: str, rng: np.random.Generator) -> Sequence[str]:
        """The words one renamed copy or drill names are made of, for ``kind`` in :attr:`RENAME_WORDS`."""
        return _name_stems(self.category) if _draws_stems(kind, rng) else made_up_words(rng)

    def copy_drills(self, demos: Sequence[Demonstration], count: int, rng: np.random.Generator, *,
                    list_share: float = 0.5, in_context: bool = False) -> list[Demonstration]:
        """``count`` short copying exercises (a user turn and the one call list that answers it; no system prompt,
        no tools, or with ``in_context`` after the system prompt and tools of the demonstration drawn, as an
        entry's first turn is seen), the first stage of a build with ``copy_drill_steps`` (in context: the drills
        ``copy_drill_mix`` mixes into the later stages):

        * with probability ``list_share`` a *list drill*: "Please run ``f`` on ``a``, ``b`` and ``c``." answered by
          ``[f(x='a'), f(x='b'), f(x='c')]``, 2-6 made-up names (:func:`made_up_word`, sometimes with a file
          extension, quoted or not), ``f`` and its string argument ``x`` drawn from the calls of ``demos``; half
          of them say "in any order" and call in a random order, so that a name's later tokens can only be
          found by matching its first one in the question (not by counting positions);
        * else a *renamed first turn*: a demonstration's first question and first call with every name the user
          spells and the call uses replaced by a made-up word (:func:`rename_names`), so the call is right only by
          copying the name from the question, as on an entry never seen.

        The names' words follow ``drill_words`` (per drill): made-up words, or the train split's word stems (a
        copied name is then spelled in the vocabulary's own word tokens, as real names are), or either.
        Made-up names cannot be memorised, so the loss on them falls only once the model copies (an induction
        circuit: find the current token earlier in the context, predict the one after it); the later stages then
        teach the task on the real entries. Deterministic given ``rng``; nothing is executed (calls are parsed by
        :func:`~trace_envs.actions.parse_call_list` only to read function and argument names).
        """
        from trace_envs.actions import parse_call_list

        if count < 0 or not 0.0 <= list_share <= 1.0:
            raise ValueError(f"count must be >= 0 and list_share in [0, 1], got {count}, {list_share}")
        firsts = []
        for demo in demos:
            k = next((i for i, m in enumerate(demo.messages) if m.get("role") == "assistant"), None)
            if k is not None and k >= 1 and demo.messages[k - 1].get("role") == "user":
                firsts.append((demo, (dict(demo.messages[k - 1]), dict(demo.messages[k]))))
        targets = sorted({(c.name, name) for _, (_, call) in firsts
                          for c in parse_call_list(str(call.get("content", ""))).calls
                          for name, value in c.kwargs.items() if isinstance(value, str)})
        if not firsts or not targets:
            raise ValueError("copy drills need demonstrations whose first turn is a call with a string argument")
        drills = []
        for _ in range(count):
            if rng.random() < list_share:
                function, argument = targets[int(rng.integers(len(targets)))]
                names = self._list_drill_names(int(rng.integers(2, 7)), rng)
                shown = [f"'{n}'" for n in names] if rng.random() < 0.5 else names
                question = f"Please run {function} on {', '.join(shown[:-1])} and {shown[-1]}"
                if rng.random() < 0.5:  # the call's order is not the question's: a name is copied by content
                    question += ", in any order"
                    names = [names[int(i)] for i in rng.permutation(len(names))]
                call = "[" + ", ".join(f"{function}({argument}={n!r})" for n in names) + "]"
                question += "."
                demo = firsts[0][0]
                if in_context:  # a context whose tools hold the drilled function (its own first call's does)
                    holders = [d for d, _ in firsts if function in _tool_names(d.tools)]
                    demo = holders[int(rng.integers(len(holders)))]
                messages = ({"role": "user", "content": question}, {"role": "assistant", "content": call})
            else:
                demo, pair = firsts[int(rng.integers(len(firsts)))]
                messages, _ = rename_names(pair, spelled_names(pair), self._words(self.drill_words, rng), rng)
            system = tuple(m for m in demo.messages[:1] if m.get("role") == "system") if in_context else ()
            drills.append(replace(demo, task_id=f"{demo.task_id}/copy-drill", messages=system + tuple(messages),
                                  tools=demo.tools if in_context else (), reward=0.0, flawed=False))
        return drills

    def _list_drill_names(self, count: int, rng: np.random.Generator) -> list[str]:
        """``count`` names for one list drill, each maybe with a file extension: fresh :func:`made_up_word` words
        (``drill_words="made_up"``), or one or two train-split stems each (``"stems"``), or either (``"mixed"``)."""
        if _draws_stems(self.drill_words, rng):
            return [_drill_name(_name_stems(self.category), rng) for _ in range(count)]
        return [made_up_word(rng) + _EXTENSIONS[int(rng.integers(len(_EXTENSIONS)))] for _ in range(count)]

    def covers(self, task: Task) -> bool:
        """Entries with >= 2 user turns and a ground-truth call after the first (room for a later flaw)."""
        truth = task.data.get("ground_truth", [])
        return len(truth) >= 2 and any(truth[t] for t in range(1, len(truth)))

    def demonstration_tasks(self) -> TaskSet:
        """Entries of the category's ``train`` split (:func:`trace_envs.tasks.bfcl.bfcl_split`; no test
        entry is demonstrated) that the demonstrator :meth:`covers`: with ``num_tasks`` None all of them;
        else those with 3-5 user turns, the ``num_tasks`` shortest by the characters of their questions
        and ground truth (ties by id); in the split's order either way.

        Why a subset: on this project's 2-core CPU a warm-start step costs about the square of the
        episode's length, and a tiny model needs several passes over each entry to act on it; the
        other entries stay undemonstrated (mostly all-fail prompts, which a good allocator skips).
        """
        from trace_envs.core import TaskSet as _TaskSet
        from trace_envs.tasks.bfcl import bfcl_split

        split = bfcl_split(self.category, "train")

        def size(task: Task) -> int:
            data = task.data
            return (sum(len(str(m.get("content", ""))) for turn in data["questions"] for m in turn)
                    + sum(len(c) for turn in data["ground_truth"] for c in turn))

        if self.num_tasks is None:
            return _TaskSet([t for t in split.values() if self.covers(t)], name=f"{split.name}/covered")
        eligible = [t for t in split.values() if 3 <= len(t.data["questions"]) <= 5 and self.covers(t)]
        chosen = {t.task_id for t in sorted(eligible, key=lambda t: (size(t), t.task_id))[:self.num_tasks]}
        return _TaskSet([t for t in split.values() if t.task_id in chosen],
                        name=f"{split.name}/demo{self.num_tasks}")

    def plan(self, env: BranchableEnv, *, flawed: bool, rng: np.random.Generator,
             kind: str | None = None) -> FlawPlan:
        """The episode's flaw (a clean plan when not ``flawed`` or when the task leaves no room for one).

        ``kind`` forces the kind (default: uniform); ``wrong_argument`` falls back to ``missing_call``
        in a turn whose calls take no argument.
        """
        if kind is not None and kind not in FLAW_KINDS:
            raise ValueError(f"unknown flaw kind {kind!r}; choose one of {', '.join(FLAW_KINDS)}")
        if not flawed:
            return FlawPlan()
        turns = [t.calls for t in env.ground_truth().turns]  # type: ignore[attr-defined]
        candidates = [t for t in range(1, len(turns)) if turns[t]]
        if not candidates:
            return FlawPlan()
        t = int(candidates[int(rng.integers(len(candidates)))])
        drawn = str(FLAW_KINDS[int(rng.integers(len(FLAW_KINDS)))])
        kind = kind or drawn
        calls = env.keyword_calls(turns[t])  # type: ignore[attr-defined]
        with_args = [i for i, c in enumerate(calls) if c.kwargs]
        if kind == "wrong_argument" and not with_args:
            kind = "missing_call"
        if kind != "wrong_argument":
            return FlawPlan(turn=t, kind=kind)
        i = int(with_args[int(rng.integers(len(with_args)))])
        name = sorted(calls[i].kwargs)[int(rng.integers(len(calls[i].kwargs)))]
        others = [s for turn in turns for c in env.keyword_calls(turn)  # type: ignore[attr-defined]
                  for v in c.kwargs.values() for s in _strings(v)]
        return FlawPlan(turn=t, kind=kind, call_index=i, argument=str(name),
                        value=wrong_value(calls[i].kwargs[name], others, rng))

    def script(self, env: BranchableEnv, plan: FlawPlan) -> list[str]:
        """Every step of the episode that follows ``plan``."""
        from trace_envs.function_calling.env import render_calls

        turns = [env.keyword_calls(t.calls) for t in env.ground_truth().turns]  # type: ignore[attr-defined]
        steps: list[str] = []
        for calls in flawed_turns(turns, plan):
            if calls:
                steps.append(render_calls(calls, style="python"))
            steps.append("Done.")
        return steps

    def act(self, env: BranchableEnv, *, flawed: bool, rng: np.random.Generator) -> str:
        done = sum(1 for m in env.messages if m.get("role") == "assistant")
        if done == 0:
            self._plan = self.plan(env, flawed=flawed, rng=rng)
            self._script = self.script(env, self._plan)
        return self._script[done] if done < len(self._script) else "Done."
