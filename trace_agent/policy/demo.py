"""The offline demo policy: a tiny Qwen3-architecture LM, warm-started on scripted demonstrations.

No model can be downloaded on the project's machines, so the project makes its
own: a byte-level BPE tokenizer trained with ``tokenizers`` on the suite's
text, wrapped as a ``PreTrainedTokenizerFast`` with a Qwen3-style chat
template (:data:`~trace_agent.policy.chat.QWEN3_CHAT_TEMPLATE`), and a small
``Qwen3ForCausalLM`` built from a :class:`DemoModelConfig` with
``AutoModelForCausalLM.from_config``. :func:`build_demo_policy` fine-tunes it on
demonstrations that a :class:`Demonstrator` scripts through the real env
(the tool observations are the env's), masks the loss to assistant tokens and
saves model + tokenizer with ``save_pretrained``. :func:`load_demo_policy` loads
it back as an :class:`~trace_agent.policy.hf.HFPolicy`.

The demo policy is meant to be *imperfect in a useful way*: it is trained
briefly, on a mix where ``flawed_fraction`` of the demonstrations make a plausible
mistake (PythonMath-v0: a wrong method for the problem's family, such as permutations
for combinations or an off-by-one range; :func:`misconception_program`), and so box a
wrong answer. Per-task success rates then spread between 0 and 1 (the families also
differ in how hard their programs are to copy), and part of the failures come from
habits that reinforcement learning can remove and that transfer to held-out problems.
:func:`evaluate_policy` measures that spread through the env.

A new env gets demonstrations by registering a :class:`Demonstrator` for its id
(:func:`register_demonstrator`); PythonMath-v0's is built in.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from trace_agent.policy.base import Message, PolicyError
from trace_agent.policy.chat import END_OF_TURN, QWEN3_CHAT_TEMPLATE, QWEN3_SPECIAL_TOKENS, ChatRenderer

if TYPE_CHECKING:
    from trace_agent.policy.hf import HFPolicy
    from trace_envs.core import BranchableEnv, Task

__all__ = [
    "DemoModelConfig",
    "DemoTrainConfig",
    "DemoBuildReport",
    "Demonstrator",
    "Demonstration",
    "PythonMathDemonstrator",
    "WikiQADemonstrator",
    "BFCLDemonstrator",
    "register_demonstrator",
    "demonstrator_for",
    "collect_demonstrations",
    "train_demo_tokenizer",
    "make_demo_model",
    "tiny_policy",
    "short_program",
    "misconception_program",
    "SHIPPED_DEMO_POLICY",
    "ensure_demo_policy",
    "build_demo_policy",
    "load_demo_policy",
    "evaluate_policy",
    "observation_messages",
    "success_histogram",
]

DEFAULT_ENV_IDS: tuple[str, ...] = ("trace_envs/PythonMath-v0",)


# --------------------------------------------------------------------------- configs
@dataclass(frozen=True, kw_only=True)
class DemoModelConfig:
    """Shape of the demo LM (a ``Qwen3Config``) and its tokenizer.

    Attributes:
        vocab_size: BPE vocabulary size the tokenizer is trained to (special tokens included).
        hidden_size: model width.
        num_layers: decoder layers.
        num_heads: attention heads.
        num_kv_heads: key/value heads (grouped-query attention).
        head_dim: width of one head (Qwen3 decouples it from hidden_size; vLLM's CPU attention
            supports 32, 64, 80, 96, 112, 128, ...).
        intermediate_size: MLP width.
        max_position_embeddings: longest context the rotary embedding is set up for.
    """

    vocab_size: int = 2048
    hidden_size: int = 128
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 384
    max_position_embeddings: int = 4096

    def __post_init__(self) -> None:
        if self.vocab_size < 300:
            raise ValueError(f"vocab_size must be >= 300 (256 bytes + specials + merges), got {self.vocab_size}")
        if min(self.hidden_size, self.num_layers, self.num_heads, self.num_kv_heads, self.intermediate_size) < 1:
            raise ValueError("model dimensions must be positive")
        if self.head_dim < 2 or self.head_dim % 2:
            raise ValueError(f"head_dim must be even and >= 2, got {self.head_dim}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")


@dataclass(frozen=True, kw_only=True)
class DemoTrainConfig:
    """How the demo policy is warm-started.

    Attributes:
        seed: seeds demonstrations, initialisation and batches (same seed + same thread count: same weights).
        steps: optimiser steps (brief on purpose: the policy should stay imperfect).
        batch_size: demonstrations per step.
        learning_rate: peak AdamW learning rate (linear warm-up, cosine decay).
        warmup_steps: steps of linear warm-up.
        weight_decay: AdamW weight decay.
        flawed_fraction: share of demonstrations whose program is perturbed (they box a wrong answer).
        env_ids: envs whose train tasks are demonstrated (each needs a registered Demonstrator).
        tasks_per_env: how many train tasks of each env are demonstrated (None: all).
        demos_per_task: demonstrations per task (different flaws).
        max_turns: the env's turn limit while demonstrating.
        model: the model and tokenizer shape.
    """

    seed: int = 0
    steps: int = 1500
    batch_size: int = 16
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    weight_decay: float = 0.01
    flawed_fraction: float = 0.4
    env_ids: tuple[str, ...] = DEFAULT_ENV_IDS
    tasks_per_env: int | None = None
    demos_per_task: int = 2
    max_turns: int = 4
    model: DemoModelConfig = field(default_factory=DemoModelConfig)

    def __post_init__(self) -> None:
        if self.steps < 0 or self.batch_size < 1 or self.warmup_steps < 0 or self.demos_per_task < 1:
            raise ValueError("steps and warmup_steps must be >= 0, batch_size and demos_per_task >= 1")
        if not self.learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {self.learning_rate}")
        if not 0.0 <= self.flawed_fraction <= 1.0:
            raise ValueError(f"flawed_fraction must be in [0, 1], got {self.flawed_fraction}")
        if not self.env_ids:
            raise ValueError("env_ids must name at least one env")
        if self.tasks_per_env is not None and self.tasks_per_env < 1:
            raise ValueError("tasks_per_env must be >= 1 or None")


@dataclass(frozen=True, kw_only=True)
class DemoBuildReport:
    """What :func:`build_demo_policy` did: sizes, timings and the training curve."""

    out_dir: str
    num_parameters: int
    size_bytes: int
    num_demonstrations: int
    num_flawed: int
    demonstration_seconds: float
    tokenizer_seconds: float
    train_seconds: float
    total_seconds: float
    losses: tuple[float, ...]
    config: Mapping[str, Any]

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, default=str)


# --------------------------------------------------------------------------- demonstrations
@dataclass(frozen=True, kw_only=True)
class Demonstration:
    """A scripted episode: the env's messages and tools after it ended, and its reward."""

    env_id: str
    task_id: str
    messages: tuple[Mapping[str, Any], ...]
    tools: tuple[Mapping[str, Any], ...]
    reward: float
    flawed: bool


class Demonstrator(Protocol):
    """Scripts one env's episodes from its task data.

    ``act`` returns the next assistant turn's text for the episode ``env`` is in (its ``task``,
    ``messages`` with the tool observations so far, and any env-specific helper such as BFCL's
    ``ground_truth_actions``). ``flawed`` asks for a plausible mistake (the demonstration then
    usually fails), so a policy trained on the mix stays imperfect. ``rng`` is the only randomness.
    A demonstrator may also define ``covers(task) -> bool``; tasks it does not cover are not demonstrated.
    """

    env_id: str

    def act(self, env: BranchableEnv, *, flawed: bool, rng: np.random.Generator) -> str:
        ...


_DEMONSTRATORS: dict[str, Callable[[], Demonstrator]] = {}


def register_demonstrator(env_id: str, factory: Callable[[], Demonstrator]) -> None:
    """Make :func:`build_demo_policy` able to demonstrate ``env_id``."""
    _DEMONSTRATORS[env_id] = factory


def demonstrator_for(env_id: str) -> Demonstrator:
    try:
        return _DEMONSTRATORS[env_id]()
    except KeyError:
        raise PolicyError(
            f"no Demonstrator for {env_id!r} (have {sorted(_DEMONSTRATORS)}); register one with register_demonstrator()"
        ) from None


def _tool_call(name: str, arguments: Mapping[str, Any]) -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": dict(arguments)}, ensure_ascii=False) + "</tool_call>"


_INT = re.compile(r"(?<![\w.])(\d+)(?![\w.])")


#: family -> (a one-line program printing the answer, the same problem by a plausible wrong method),
#: each built from a generated task's ``params``.
_ONE_LINERS: dict[str, tuple[Callable[[Mapping[str, Any]], str], Callable[[Mapping[str, Any]], str]]] = {
    "divisor_count": (
        lambda p: f"print(sympy.divisor_count({p['n']}))",
        lambda p: f"print(len(sympy.divisors({p['n']})) - 1)",
    ),
    "divisor_sum": (
        lambda p: f"print(sympy.divisor_sigma({p['n']}))",
        lambda p: f"print(sympy.divisor_sigma({p['n']}) - {p['n']})",
    ),
    "totient": (
        lambda p: f"print(sympy.totient({p['n']}))",
        lambda p: f"print({p['n']} - 1)",
    ),
    "prime_count": (
        lambda p: f"print(sympy.primepi({p['b']}) - sympy.primepi({p['a'] - 1}))",
        lambda p: f"print(sympy.primepi({p['b']}))",
    ),
    "digit_sum_power": (
        lambda p: f"print(sum(map(int, str({p['a']}**{p['b']}))))",
        lambda p: f"print(sum(map(int, str({p['a']} * {p['b']}))))",
    ),
    "modpow": (
        lambda p: f"print(pow({p['a']}, {p['b']}, {p['m']}))",
        lambda p: f"print({p['a']} * {p['b']} % {p['m']})",
    ),
    "mod_inverse": (
        lambda p: f"print(pow({p['a']}, -1, {p['m']}))",
        lambda p: f"print(pow({p['a']}, {p['m']} - 1, {p['m']}))",
    ),
    "binomial": (
        lambda p: f"print(math.comb({p['n']}, {p['k']}))",
        lambda p: f"print(math.perm({p['n']}, {p['k']}))",
    ),
    "derangements": (
        lambda p: f"print(sympy.subfactorial({p['n']}))",
        lambda p: f"print(math.factorial({p['n']}) - 1)",
    ),
    "power_sum": (
        lambda p: f"print(sum(k**{p['p']} for k in range(1, {p['n']} + 1)))",
        lambda p: f"print(sum(k**{p['p']} for k in range(1, {p['n']})))",
    ),
    "fibonacci": (
        lambda p: f"print(sympy.fibonacci({p['n']}))",
        lambda p: f"print(sympy.fibonacci({p['n']} + 1))",
    ),
    "count_divisible": (
        lambda p: (f"print(sum(1 for k in range(1, {p['n']} + 1) "
                   f"if (k % {p['a']} == 0 or k % {p['b']} == 0) and k % {p['c']}))"),
        lambda p: f"print(sum(1 for k in range(1, {p['n']} + 1) if k % {p['a']} == 0 or k % {p['b']} == 0))",
    ),
    "digit_sum_count": (
        lambda p: f"print(sum(1 for k in range(1, {p['n']} + 1) if sum(map(int, str(k))) == {p['s']}))",
        lambda p: f"print(sum(1 for k in range(1, {p['n']} + 1) if sum(map(int, str(k))) <= {p['s']}))",
    ),
    "coprime_probability": (
        lambda p: f"print(sympy.Rational(sum(math.gcd(k, {p['m']}) == 1 for k in range(1, {p['n']} + 1)), {p['n']}))",
        lambda p: f"print(sympy.Rational(sum(math.gcd(k, {p['m']}) == 1 for k in range(1, {p['n']} + 1)), {p['m']}))",
    ),
}


def short_program(family: str, p: Mapping[str, Any]) -> str | None:
    """A one-line program (sympy / stdlib) that prints a generated task's answer, or None.

    Used for levels 1–2, where each is checked against the task's answer in the tests;
    a small model learns these far faster than the long reference ``solution_code``.
    """
    programs = _ONE_LINERS.get(family)
    return programs[0](p) if programs else None


def misconception_program(family: str, p: Mapping[str, Any]) -> str | None:
    """A one-line program for a generated task that applies a plausible *wrong method*, or None.

    The mistakes a careless solver makes: proper instead of all divisors, permutations instead of
    combinations, an off-by-one range or index, a dropped condition, the wrong denominator, a misremembered theorem
    (``pow(a, m - 1, m)`` for an inverse), a product for a power. Each is wrong on almost every
    level 1–2 task of its family (checked in the tests), so a policy that learned it sometimes
    has a family-level habit that reinforcement learning can unlearn, and the fix carries over to
    held-out problems of the same family.
    """
    programs = _ONE_LINERS.get(family)
    return programs[1](p) if programs else None


class PythonMathDemonstrator:
    """PythonMath-v0: run a program for the task, then box what it printed.

    The program is a one-liner (:func:`short_program`) for levels 1–2 and the task's reference
    ``solution_code`` for level 3, so level-3 problems stay hard for a small model.

    A flawed demonstration runs the family's plausible wrong method (:func:`misconception_program`)
    where the task has a one-line program, and otherwise changes one integer literal of the program
    by ±1 (or ±2); the answer then boxes the wrong output, as a careless solver would.
    """

    env_id = "trace_envs/PythonMath-v0"

    def covers(self, task: Task) -> bool:
        """Only levels 1–2 of the families with a one-line program are demonstrated.

        The rest (level 3, and families such as lattice paths) the policy never sees solved,
        which keeps it imperfect in a useful way: some prompts always fail, some are mixed.
        """
        data = task.data
        return int(data.get("level", 3)) <= 2 and short_program(str(data.get("family")), data.get("params", {})) is not None

    def act(self, env: BranchableEnv, *, flawed: bool, rng: np.random.Generator) -> str:
        task = env.task
        tool_outputs = [m["content"] for m in env.messages if m.get("role") == "tool"]
        if not tool_outputs:
            short = wrong = None
            if int(task.data.get("level", 3)) <= 2 and "family" in task.data:
                family, params = str(task.data["family"]), task.data.get("params", {})
                short, wrong = short_program(family, params), misconception_program(family, params)
            if short is not None:  # a family with a one-liner also has its wrong method
                code = "import math, sympy\n" + (wrong if flawed else short)
            else:
                code = str(task.data.get("solution_code") or f"print({task.data['answer']!r})")
                if flawed:
                    code = _perturb_code(code, rng)
            return _tool_call("python", {"code": code})
        result = tool_outputs[-1].strip().splitlines()
        answer = result[-1].strip() if result else ""
        return f"<answer>\\boxed{{{answer}}}</answer>"


def _perturb_code(code: str, rng: np.random.Generator) -> str:
    literals = [m for m in _INT.finditer(code) if int(m.group(1)) > 2]
    if not literals:
        return code
    m = literals[int(rng.integers(len(literals)))]
    delta = int(rng.choice([-2, -1, 1, 2]))
    return code[:m.start()] + str(int(m.group(1)) + delta) + code[m.end():]


class WikiQADemonstrator:
    """WikiQA-v0: one search per hop (the task's ``queries``), then the gold answer.

    A flawed demonstration stops after the first hop and answers with the bridge entity.
    """

    env_id = "trace_envs/WikiQA-v0"

    def act(self, env: BranchableEnv, *, flawed: bool, rng: np.random.Generator) -> str:
        data = env.task.data
        queries = list(data.get("queries") or [data.get("question", env.task.prompt)])
        done = sum(1 for m in env.messages if m.get("role") == "assistant")
        if flawed and done >= 1:
            titles = list(data.get("supporting_titles") or [])
            return f"<answer>{titles[0] if titles else queries[0]}</answer>"
        if done < len(queries):
            return _tool_call("search", {"query": queries[done]})
        return f"<answer>{(data.get('answers') or [''])[0]}</answer>"


class BFCLDemonstrator:
    """BFCL-v0: replay the task's ground truth (the env's ``ground_truth_actions``, JSON tool calls).

    A flawed demonstration skips one step's calls (says it is done without making them).
    """

    env_id = "trace_envs/BFCL-v0"

    def act(self, env: BranchableEnv, *, flawed: bool, rng: np.random.Generator) -> str:
        actions = env.ground_truth_actions(style="json")  # type: ignore[attr-defined]
        done = sum(1 for m in env.messages if m.get("role") == "assistant")
        if done >= len(actions):
            return "Done."
        if flawed and done == 0 and actions[0] != "Done.":
            return "Done."
        return actions[done]


register_demonstrator(PythonMathDemonstrator.env_id, PythonMathDemonstrator)
register_demonstrator(WikiQADemonstrator.env_id, WikiQADemonstrator)
register_demonstrator(BFCLDemonstrator.env_id, BFCLDemonstrator)


def _make_env(env_id: str, *, max_turns: int, demonstration: bool = False) -> BranchableEnv:
    """The env, on its demonstration task pool when ``demonstration`` and the env has one."""
    import gymnasium as gym

    import trace_envs  # noqa: F401  (registers the suite)

    kwargs: dict[str, Any] = {"max_turns": max_turns}
    if demonstration and env_id == "trace_envs/PythonMath-v0":
        kwargs["tasks"] = _math_demonstration_tasks()
    return gym.make(env_id, **kwargs).unwrapped


def _math_demonstration_tasks(batches: int = 10, seed: int = 7) -> Any:
    """Generated math problems for demonstrations: several times the train split (so the model
    learns to copy numbers, not to recall problems), deduplicated, none equal to a test problem."""
    from trace_envs.core import TaskSet
    from trace_envs.tasks.math_gen import DEFAULT_SPLIT_SIZES, default_math_tasks, generate_math_tasks

    seen = {task.prompt for task in default_math_tasks("test").values()}
    tasks = []
    for b in range(batches):
        for task in generate_math_tasks(DEFAULT_SPLIT_SIZES["train"], seed=seed + b, id_prefix=f"math-demo{b}"):
            if task.prompt not in seen:
                seen.add(task.prompt)
                tasks.append(task)
    return TaskSet(tasks, name=f"math-demo-{batches}x-{seed}")


def collect_demonstrations(
    env_id: str,
    *,
    task_ids: Sequence[str] | None = None,
    limit: int | None = None,
    demos_per_task: int = 1,
    flawed_fraction: float = 0.0,
    seed: int = 0,
    max_turns: int = 4,
) -> list[Demonstration]:
    """Play scripted episodes of ``env_id`` through the real env.

    With ``task_ids``, on those tasks of the env's default (train) task set. Without, on the
    env's demonstration pool (PythonMath-v0: 3,000 generated problems, none equal to a test
    problem; other envs: their train tasks), its first ``limit`` tasks when given.
    """
    demonstrator = demonstrator_for(env_id)
    rng = np.random.default_rng(seed)
    env = _make_env(env_id, max_turns=max_turns, demonstration=task_ids is None)
    demos: list[Demonstration] = []
    try:
        ids = list(task_ids) if task_ids is not None else env.tasks.ids()[:limit]
        covers = getattr(demonstrator, "covers", None)
        if covers is not None:
            ids = [task_id for task_id in ids if covers(env.tasks[task_id])]
        for task_id in ids:
            for _ in range(demos_per_task):
                flawed = bool(rng.random() < flawed_fraction)
                env.reset(seed=int(rng.integers(2**31)), options={"task_id": task_id})
                reward = 0.0
                done = False
                while not done:
                    action = demonstrator.act(env, flawed=flawed, rng=rng)
                    _, reward, terminated, truncated, _ = env.step(action)
                    done = terminated or truncated
                demos.append(Demonstration(env_id=env_id, task_id=task_id, messages=tuple(env.messages),
                                           tools=tuple(env.tools), reward=float(reward), flawed=flawed))
    finally:
        env.close()
    return demos


def demonstration_tokens(chat: ChatRenderer, demo: Demonstration) -> tuple[list[int], list[bool]]:
    """The ids a policy would see for ``demo`` (root rendered once, turns appended) and the loss mask.

    Assistant turns are their canonical encoding + end-of-turn (mask True); everything else False.
    The trailing observation after the last assistant turn is dropped.
    """
    messages = list(demo.messages)
    first = next((i for i, m in enumerate(messages) if m["role"] == "assistant"), None)
    if first is None:
        raise PolicyError(f"demonstration of {demo.task_id!r} has no assistant turn")
    ids = list(chat.render(messages[:first], demo.tools).token_ids)
    mask = [False] * len(ids)
    i = first
    while i < len(messages):
        turn = chat.encode(messages[i]["content"]) + [chat.end_of_turn_id]
        ids += turn
        mask += [True] * len(turn)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if j < len(messages):  # observations between this turn and the next assistant turn
            obs = chat.encode(chat.observation_text(messages[i + 1:j]))
            ids += obs
            mask += [False] * len(obs)
        i = j
    return ids, mask


# --------------------------------------------------------------------------- tokenizer and model
def _wrap_tokenizer(backend: Any) -> Any:
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        clean_up_tokenization_spaces=False,
        model_max_length=32768,
    )
    tok.chat_template = QWEN3_CHAT_TEMPLATE
    return tok


def _bpe_backend(vocab_size: int, texts: Sequence[str] | None) -> Any:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    backend = Tokenizer(models.BPE())
    # Qwen2/3's split: letters runs, single digits, punctuation runs, newlines, spaces.
    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    special = list(QWEN3_SPECIAL_TOKENS[:3])
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - (len(QWEN3_SPECIAL_TOKENS) - len(special)),
        special_tokens=special,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(list(texts or []), trainer=trainer)
    backend.add_tokens([AddedToken(t, special=False, normalized=False) for t in QWEN3_SPECIAL_TOKENS[3:]])
    return backend


def train_demo_tokenizer(
    demos: Sequence[Demonstration] | Sequence[str], *, vocab_size: int = 2048
) -> Any:
    """A byte-level BPE ``PreTrainedTokenizerFast`` with the Qwen3 special tokens and chat template.

    Trained on the chat-template renderings of ``demos`` (or on the given texts), so the template's
    boilerplate and the suite's vocabulary get merges. Deterministic for the same input.
    """
    if demos and isinstance(demos[0], str):
        texts = [str(t) for t in demos]
    else:
        bootstrap = ChatRenderer(_wrap_tokenizer(_bpe_backend(300, [])), end_of_turn=END_OF_TURN)
        texts = [bootstrap.render_text(d.messages, d.tools, add_generation_prompt=False)
                 for d in demos]  # type: ignore[union-attr]
    return _wrap_tokenizer(_bpe_backend(vocab_size, texts))


def make_demo_model(tokenizer: Any, config: DemoModelConfig, *, seed: int = 0) -> Any:
    """A freshly initialised ``Qwen3ForCausalLM`` (``AutoModelForCausalLM.from_config``) for ``tokenizer``."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    qwen = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_kv_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(qwen, dtype=torch.float32)
    return model


_TINY_CORPUS = (
    "You solve math problems. Run Python with the python tool and answer with <answer>\\boxed{42}</answer>.",
    '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>',
    "How many positive divisors does 12 have? The answer is 6. What is the remainder of 2^10 mod 7?",
)


def tiny_policy(*, seed: int = 0, model: DemoModelConfig | None = None, device: str = "cpu") -> HFPolicy:
    """An untrained tiny demo-architecture policy (a tokenizer trained on a few lines), for tests."""
    from trace_agent.policy.hf import HFPolicy

    cfg = model or DemoModelConfig(vocab_size=400, hidden_size=64, num_layers=2, num_heads=2, num_kv_heads=1,
                                   head_dim=32, intermediate_size=128)
    tokenizer = train_demo_tokenizer(list(_TINY_CORPUS) * 4, vocab_size=cfg.vocab_size)
    return HFPolicy(make_demo_model(tokenizer, cfg, seed=seed), tokenizer, device=device)


# --------------------------------------------------------------------------- build / load
def _directory_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def build_demo_policy(
    out_dir: str | Path,
    *,
    seed: int = 0,
    steps: int | None = None,
    config: DemoTrainConfig | None = None,
    log: Callable[[str], None] | None = None,
    progress: bool = False,
) -> DemoBuildReport:
    """Demonstrate, train the tokenizer, warm-start the tiny LM, ``save_pretrained`` it to ``out_dir``.

    ``seed`` and ``steps`` override ``config``'s. Writes ``build_report.json`` beside the weights.
    The training loop checkpoints into ``out_dir/.build`` every 100 steps and a new call with the
    same settings resumes from there (the directory is removed when the build ends); ``progress``
    shows a bar with ETA.
    """
    cfg = config or DemoTrainConfig()
    cfg = DemoTrainConfig(**{**{f: getattr(cfg, f) for f in cfg.__dataclass_fields__},
                             "seed": seed, "steps": cfg.steps if steps is None else steps})
    say = log or (lambda _msg: None)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()

    demos: list[Demonstration] = []
    for k, env_id in enumerate(cfg.env_ids):
        demos += collect_demonstrations(env_id, limit=cfg.tasks_per_env, demos_per_task=cfg.demos_per_task,
                                        flawed_fraction=cfg.flawed_fraction, seed=cfg.seed * 1000 + k,
                                        max_turns=cfg.max_turns)
    t_demo = time.perf_counter()
    say(f"{len(demos)} demonstrations in {t_demo - t0:.1f}s "
        f"({sum(d.flawed for d in demos)} flawed, {sum(d.reward > 0 for d in demos)} successful)")

    tokenizer = train_demo_tokenizer(demos, vocab_size=cfg.model.vocab_size)
    chat = ChatRenderer(tokenizer)
    encoded = [demonstration_tokens(chat, d) for d in demos]
    t_tok = time.perf_counter()
    lengths = [len(ids) for ids, _ in encoded]
    say(f"tokenizer: {len(tokenizer)} tokens in {t_tok - t_demo:.1f}s; sequences {min(lengths)}-{max(lengths)} "
        f"tokens (mean {sum(lengths) / len(lengths):.0f})")

    model = make_demo_model(tokenizer, cfg.model, seed=cfg.seed)
    losses = _train(model, encoded, cfg, pad_id=chat.pad_token_id, log=say, checkpoint_dir=out / ".build",
                    progress=progress)
    t_train = time.perf_counter()

    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    import shutil

    shutil.rmtree(out / ".build", ignore_errors=True)
    size = _directory_size(out)
    report = DemoBuildReport(
        out_dir=str(out),
        num_parameters=sum(p.numel() for p in model.parameters()),
        size_bytes=size,
        num_demonstrations=len(demos),
        num_flawed=sum(d.flawed for d in demos),
        demonstration_seconds=t_demo - t0,
        tokenizer_seconds=t_tok - t_demo,
        train_seconds=t_train - t_tok,
        total_seconds=time.perf_counter() - t0,
        losses=tuple(losses),
        config=asdict(cfg),
    )
    (out / "build_report.json").write_text(report.to_json())
    return report


def _common_prefix_length(seqs: Sequence[Sequence[int]]) -> int:
    first = seqs[0]
    n = min(len(q) for q in seqs)
    for q in seqs[1:]:
        k = 0
        while k < n and q[k] == first[k]:
            k += 1
        n = k
    return n


def _train(model: Any, encoded: Sequence[tuple[list[int], list[bool]]], cfg: DemoTrainConfig, *,
           pad_id: int, log: Callable[[str], None], checkpoint_dir: Path | None = None,
           checkpoint_every: int = 100, progress: bool = False) -> list[float]:
    """Masked next-token loss on assistant tokens, with the shared prompt prefix computed once per step.

    Demonstrations of one env share a long prefix (system prompt and tool schemas): each step runs it
    once (batch 1, with gradients), repeats its KV cache over the batch and runs only the rest of every
    sequence on top of it, which cuts the tokens processed per step about fourfold.

    With ``checkpoint_dir`` the loop saves model, optimiser, schedule, batch generator and losses
    there every ``checkpoint_every`` steps (safetensors + JSON, :mod:`trace_agent.checkpoint`) and,
    when it finds a checkpoint of the same config and data there, continues from it, so a stopped
    build resumes where it was and ends with the same weights. ``progress`` shows a bar with ETA.
    """
    import hashlib
    import inspect

    import torch
    from tqdm import tqdm

    from trace_agent.checkpoint import CheckpointError, read_checkpoint, write_checkpoint

    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (seq, _) in enumerate(encoded):
        groups.setdefault(tuple(seq[:32]), []).append(i)
    plans = []  # (prefix ids, member indices), prefix never covering a trained token
    for members in groups.values():
        n = _common_prefix_length([encoded[i][0] for i in members])
        n = min(n, *(encoded[i][1].index(True) for i in members)) - 1
        plans.append((encoded[members[0]][0][:max(n, 0)], members))
    weights = torch.tensor([len(m) for _, m in plans], dtype=torch.float)
    cache_arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    gen = torch.Generator().manual_seed(cfg.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.learning_rate, weight_decay=cfg.weight_decay,
                                  betas=(0.9, 0.98))

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    model.train()
    losses: list[float] = []
    fingerprint = hashlib.sha256(json.dumps([asdict(cfg), [list(x) for x in encoded]],
                                            default=str).encode()).hexdigest()
    first = 0
    if checkpoint_dir is not None and (checkpoint_dir / "manifest.json").exists():
        try:
            state = read_checkpoint(checkpoint_dir)
            if state.get("fingerprint") == fingerprint:
                model.load_state_dict(state["model"])
                optimizer.load_state_dict(state["optimizer"])
                scheduler.load_state_dict(state["scheduler"])
                gen.set_state(state["generator"])
                losses = [float(x) for x in state["losses"]]
                first = int(state["step"])
                log(f"resuming the demo-policy build at step {first}/{cfg.steps} from {checkpoint_dir}")
            else:
                log(f"{checkpoint_dir} holds a build of other settings or data: starting over")
        except (CheckpointError, KeyError, RuntimeError, ValueError) as exc:
            log(f"cannot resume the demo-policy build ({exc}): starting over")
    bar = tqdm(range(first, cfg.steps), initial=first, total=cfg.steps, desc="demo policy", unit="step",
               disable=not progress, dynamic_ncols=True)
    for step in bar:
        prefix, members = plans[int(torch.multinomial(weights, 1, generator=gen).item())]
        picks = [members[j] for j in torch.randint(len(members), (cfg.batch_size,), generator=gen).tolist()]
        p = len(prefix)
        width = max(len(encoded[i][0]) for i in picks) - p
        ids = torch.full((cfg.batch_size, width), pad_id, dtype=torch.long)
        labels = torch.full((cfg.batch_size, width), -100, dtype=torch.long)
        attention = torch.zeros((cfg.batch_size, p + width), dtype=torch.long)
        attention[:, :p] = 1
        for row, i in enumerate(picks):
            seq, mask = encoded[i]
            rest = torch.tensor(seq[p:])
            ids[row, :len(rest)] = rest
            attention[row, p:p + len(rest)] = 1
            labels[row, :len(rest)] = torch.where(torch.tensor(mask[p:]), rest, -100)
        kwargs: dict[str, Any] = {}
        if p:
            out = model(input_ids=torch.tensor([prefix]), use_cache=True)
            cache = out.cache if getattr(out, "cache", None) is not None else out.past_key_values
            cache.batch_repeat_interleave(cfg.batch_size)
            kwargs[cache_arg] = cache
        positions = torch.arange(p, p + width)[None, :].expand(cfg.batch_size, -1)
        logits = model(input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=bool(p),
                       **kwargs).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 labels[:, 1:].reshape(-1), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        losses.append(float(loss.item()))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
        if ((step + 1) % 25 == 0 or step == cfg.steps - 1) and not progress:
            log(f"step {step + 1}/{cfg.steps} loss {sum(losses[-25:]) / len(losses[-25:]):.3f}")
        if checkpoint_dir is not None and checkpoint_every and (step + 1) % checkpoint_every == 0 \
                and step + 1 < cfg.steps:
            write_checkpoint(checkpoint_dir, {"fingerprint": fingerprint, "step": step + 1, "model": model.state_dict(),
                                              "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                                              "generator": gen.get_state(), "losses": losses})
    bar.close()
    model.eval()
    return losses


#: The demo policy the project ships (built by ``scripts/build_demo_policy.py --steps 400 --seed 0``;
#: its ``build_report.json`` holds the losses and timings).
SHIPPED_DEMO_POLICY = Path(__file__).resolve().parent / "assets" / "demo_policy"


def ensure_demo_policy(path: str | Path | None = None, *, seed: int = 0, steps: int | None = None,
                       log: Callable[[str], None] | None = None) -> Path:
    """The directory of a demo policy: the shipped one when ``path`` is None or empty, else ``path``,
    built there first (:func:`build_demo_policy`) when it holds no model."""
    if not path:
        return SHIPPED_DEMO_POLICY
    target = Path(path)
    if not (target / "config.json").exists():
        if log is not None:
            log(f"building the demo policy in {target} (minutes, once)")
        build_demo_policy(target, seed=seed, steps=steps, log=log, progress=True)
    return target


def load_demo_policy(path: str | Path = SHIPPED_DEMO_POLICY, *, device: str = "cpu",
                     max_batch_size: int = 32) -> HFPolicy:
    """The demo policy saved by :func:`build_demo_policy`, loaded with ``HFPolicy.from_pretrained``."""
    from trace_agent.policy.hf import HFPolicy

    if not (Path(path) / "config.json").exists():
        raise PolicyError(f"no demo policy at {path}: build it with scripts/build_demo_policy.py")
    return HFPolicy.from_pretrained(path, device=device, max_batch_size=max_batch_size)


# --------------------------------------------------------------------------- evaluation
def observation_messages(messages: Sequence[Message]) -> list[Message]:
    """The messages after the last assistant turn: what ``Policy.extend`` appends after a step."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    if last < 0:
        raise PolicyError("no assistant turn in the messages")
    return [dict(m) for m in messages[last + 1:]]


def evaluate_policy(
    policy: Any,
    env_id: str,
    task_ids: Sequence[str],
    *,
    samples: int = 8,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_new_tokens: int = 256,
    max_turns: int = 4,
    seed: int = 0,
    env_kwargs: Mapping[str, Any] | None = None,
) -> dict[str, list[float]]:
    """Rewards of ``samples`` episodes per task, played through the real env with ``policy``.

    The ``samples`` episodes of one task run side by side (one env each, one batched
    ``generate`` per turn). Returns task id -> rewards.
    """
    import gymnasium as gym

    import trace_envs  # noqa: F401

    envs = [gym.make(env_id, max_turns=max_turns, **dict(env_kwargs or {})).unwrapped for _ in range(samples)]
    results: dict[str, list[float]] = {}
    try:
        for t, task_id in enumerate(task_ids):
            contexts = []
            for k, env in enumerate(envs):
                env.reset(seed=seed + 1000 * t + k, options={"task_id": task_id})
                contexts.append(policy.render(env.messages, env.tools))
            rewards = [0.0] * samples
            alive = list(range(samples))
            turn = 0
            while alive:
                gens = policy.generate([contexts[k] for k in alive], max_new_tokens=max_new_tokens,
                                       temperature=temperature, top_p=top_p, seed=seed + 7919 * t + turn)
                still = []
                for k, g in zip(alive, gens):
                    obs, reward, terminated, truncated, _ = envs[k].step(g.text)
                    rewards[k] = float(reward)
                    if not (terminated or truncated):
                        contexts[k] = policy.extend(contexts[k], g, observation_messages(envs[k].messages))
                        still.append(k)
                alive = still
                turn += 1
            results[task_id] = rewards
    finally:
        for env in envs:
            env.close()
    return results


def success_histogram(results: Mapping[str, Sequence[float]], *, bins: int = 5) -> dict[str, Any]:
    """Per-task success rates summarised: histogram over [0, 1], all-fail / mixed / all-success counts."""
    rates = [float(np.mean([r > 0 for r in rewards])) for rewards in results.values() if rewards]
    edges = np.linspace(0.0, 1.0, bins + 1)
    counts, _ = np.histogram(rates, bins=edges)
    return {
        "tasks": len(rates),
        "mean_success": float(np.mean(rates)) if rates else math.nan,
        "all_fail": sum(r == 0.0 for r in rates),
        "all_success": sum(r == 1.0 for r in rates),
        "mixed": sum(0.0 < r < 1.0 for r in rates),
        "histogram": {f"[{edges[i]:.1f},{edges[i + 1]:.1f}{']' if i == bins - 1 else ')'}": int(c)
                      for i, c in enumerate(counts)},
        "rates": rates,
    }
