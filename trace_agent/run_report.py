"""What a training run did, in one report: the held-out change with its noise, tasks won and lost, where the time went.

:func:`heldout_change` compares two held-out evaluations of the same tasks (before and after
training) task by task; :func:`run_phases` splits a run's wall clock into its phases from its
``metrics.jsonl``; :func:`build_run_report` puts both together with the learning curve and the
budget, :func:`format_run_report` renders it as the lines ``make demo`` and ``trace-gym train``
print, and :meth:`RunReport.to_dict` is what ``<run>/run_report.json`` holds.

The statistics. Episodes of one task are not independent draws (a task the policy cannot solve
fails all its samples), so the task, not the episode, is the unit: with ``T`` tasks evaluated
before and after with the same number of samples each, ``d_t`` = (after rate − before rate) of
task ``t``, the gain is ``mean(d)`` (equal to the difference of the episode means) and its
standard error is ``sd(d) / sqrt(T)`` (sample standard deviation, ``T − 1`` in the denominator):
the cluster-robust standard error with tasks as clusters, paired because both evaluations play
the same tasks (Cameron & Miller 2015, "A Practitioner's Guide to Cluster-Robust Inference").
It counts both evaluations' sampling noise and the correlation between them. When the per-task
rates of either evaluation are missing (a resumed run keeps only the logged means), the two
evaluations' own cluster standard errors are combined as independent (``sqrt(se_b² + se_a²)``,
larger than the paired one when the tasks' rates are positively correlated) and the report says
it is unpaired. The gain is *beyond the evaluation's noise* when it is at least
:data:`NOISE_SES` (2) standard errors; the interval printed is gain ± 1.96 standard errors.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TextIO

__all__ = [
    "NOISE_SES",
    "HeldoutChange",
    "heldout_change",
    "Phases",
    "run_phases",
    "RunReport",
    "build_run_report",
    "format_run_report",
    "load_run_report",
    "print_run_report",
    "REPORT_FILE",
    "finite_float",
]

#: The report's file in a run directory (written by :func:`trace_agent.run.run_training`).
REPORT_FILE = "run_report.json"

#: A gain of at least this many standard errors is reported as beyond the evaluation's noise.
NOISE_SES = 2.0

_Z95 = 1.959963984540054


@dataclass(frozen=True, kw_only=True)
class HeldoutChange:
    """Held-out success before -> after training on the same tasks (see the module docstring).

    Attributes:
        tasks: tasks compared.
        before, after: mean success over those tasks (equal samples per task: the episode means).
        before_se, after_se: each evaluation's cluster standard error (tasks as clusters).
        gain: ``after - before``.
        gain_se: the gain's standard error: paired over tasks, or unpaired when ``paired`` is false.
        paired: whether per-task rates were compared (else only the two means were known).
        solved_before, solved_after: tasks solved at least once.
        newly_solved: tasks solved at least once after but never before (paired only).
        newly_lost: tasks solved at least once before but never after (paired only).
    """

    tasks: int
    before: float
    after: float
    before_se: float
    after_se: float
    gain: float
    gain_se: float
    paired: bool
    solved_before: int
    solved_after: int
    newly_solved: tuple[str, ...] = ()
    newly_lost: tuple[str, ...] = ()

    @property
    def interval(self) -> tuple[float, float]:
        """The gain's 95% interval (gain ± 1.96 standard errors)."""
        return self.gain - _Z95 * self.gain_se, self.gain + _Z95 * self.gain_se

    @property
    def z(self) -> float:
        """The gain in standard errors (NaN when the standard error is 0: one task, or no spread)."""
        return self.gain / self.gain_se if self.gain_se > 0 else math.nan

    @property
    def beyond_noise(self) -> bool:
        """True when the gain is positive and at least :data:`NOISE_SES` standard errors (a 0 s.e. never is)."""
        return self.gain_se > 0 and self.gain > 0 and self.gain >= NOISE_SES * self.gain_se

    def verdict(self) -> str:
        """One line: is the gain beyond the evaluation's noise?"""
        how = "paired over tasks" if self.paired else "unpaired: per-task rates missing"
        if self.gain_se <= 0:
            return (f"the gain {self.gain:+.3f} cannot be judged against the evaluation's noise: its standard error "
                    f"is 0 ({self.tasks} task(s) with equal changes); evaluate more tasks")
        z = self.z
        if self.beyond_noise:
            return (f"the gain {self.gain:+.3f} is beyond the evaluation's noise: {z:.1f} standard errors "
                    f"(>= {NOISE_SES:g}; s.e. {self.gain_se:.3f}, {how})")
        return (f"the gain {self.gain:+.3f} is NOT beyond the evaluation's noise: {z:.1f} standard errors "
                f"(< {NOISE_SES:g}; s.e. {self.gain_se:.3f}, {how})")


def _sd(values: Sequence[float]) -> float:
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def heldout_change(before: Any, after: Any) -> HeldoutChange:
    """Compare two held-out evaluations (:class:`~trace_agent.evaluation.EvalResult` or alike).

    ``before`` and ``after`` need ``success``, ``success_se``, ``solved_tasks`` and ``per_task``
    (task id -> success rate). With both ``per_task`` maps filled the comparison is paired over
    the tasks they share; tasks they do not share are an error (the two evaluations must play
    the same tasks). With either map empty, the unpaired form is used (module docstring).

    Raises:
        ValueError: the per-task maps name different tasks.
    """
    b_rates: Mapping[str, float] = before.per_task or {}
    a_rates: Mapping[str, float] = after.per_task or {}
    if b_rates and a_rates:
        if set(b_rates) != set(a_rates):
            only_b = sorted(set(b_rates) - set(a_rates))[:3]
            only_a = sorted(set(a_rates) - set(b_rates))[:3]
            raise ValueError(f"the two evaluations played different tasks (only before: {only_b}, only after: "
                             f"{only_a}): evaluate both with the same eval.split, eval.tasks and seed")
        ids = sorted(b_rates)
        b = [float(b_rates[t]) for t in ids]
        a = [float(a_rates[t]) for t in ids]
        d = [y - x for x, y in zip(b, a, strict=True)]
        n = len(ids)
        return HeldoutChange(
            tasks=n, before=sum(b) / n, after=sum(a) / n, before_se=_sd(b) / math.sqrt(n),
            after_se=_sd(a) / math.sqrt(n), gain=sum(d) / n, gain_se=_sd(d) / math.sqrt(n), paired=True,
            solved_before=sum(x > 0 for x in b), solved_after=sum(y > 0 for y in a),
            newly_solved=tuple(t for t, x, y in zip(ids, b, a, strict=True) if x == 0 and y > 0),
            newly_lost=tuple(t for t, x, y in zip(ids, b, a, strict=True) if x > 0 and y == 0),
        )
    return HeldoutChange(
        tasks=int(after.tasks), before=float(before.success), after=float(after.success),
        before_se=float(before.success_se), after_se=float(after.success_se),
        gain=float(after.success) - float(before.success),
        gain_se=math.hypot(float(before.success_se), float(after.success_se)), paired=False,
        solved_before=int(before.solved_tasks), solved_after=int(after.solved_tasks),
    )


@dataclass(frozen=True, kw_only=True)
class Phases:
    """Where a run's wall clock went, in seconds.

    Attributes:
        total_s: the run, start to report (``setup_s`` + evaluations + steps + ``other_s``).
        setup_s: before the first evaluation or step: policy load, the predictor's copy, the trainer.
        evaluations: ``(step, seconds)`` of each held-out evaluation (step 0 = before training);
            each starts its own sandboxes (one per episode played side by side).
        steps_s: the training steps (collection, predictor, update); the first step also starts
            the collector's sandboxes.
        first_step_s: the first step logged.
        step_parts: ``generation``, ``env``, ``predictor``, ``update`` seconds summed over the steps.
        predictor_share: predictor seconds / step seconds: the step's wall clock that waited for
            the predictor (scoring no generation or env call ran beside, then the refresh).
        predictor_busy_share: the time inside the predictor's calls (on their own thread, most of
            it beside generation and env calls) plus the refresh, over step seconds (NaN when the
            records do not carry it).
        other_s: the rest: checkpoints, saving the policy, plots.
    """

    total_s: float
    setup_s: float
    evaluations: tuple[tuple[int, float], ...]
    steps_s: float
    first_step_s: float
    step_parts: dict[str, float] = field(default_factory=dict)
    predictor_share: float = math.nan
    predictor_busy_share: float = math.nan
    other_s: float = 0.0

    @property
    def evaluations_s(self) -> float:
        return sum(s for _, s in self.evaluations)


def finite_float(value: Any) -> float | None:
    """``value`` as a float; None where it is missing, not a number or not finite (a record without that figure)."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def run_phases(records: Sequence[Mapping[str, Any]], *, total_s: float, setup_s: float) -> Phases:
    """:class:`Phases` of a run from its ``metrics.jsonl`` records and two measured times.

    Evaluations are the records' ``eval/seconds``; steps their ``time/step_s`` (and the
    ``time/<part>_s`` parts); ``other_s`` is what is left of ``total_s`` (never below 0).
    """
    evaluations = tuple((int(r["step"]), s) for r in records if (s := finite_float(r.get("eval/seconds"))) is not None)
    steps = [r for r in records if finite_float(r.get("time/step_s")) is not None]
    steps_s = sum(float(r["time/step_s"]) for r in steps)
    parts = {k: sum(finite_float(r.get(f"time/{k}_s")) or 0.0 for r in steps)
             for k in ("generation", "env", "predictor", "update")}
    other = total_s - setup_s - steps_s - sum(s for _, s in evaluations)
    busy = [(finite_float(r.get("time/predictor_scoring_busy_s")), finite_float(r.get("time/predictor_refresh_s"))) for r in steps]
    busy_s = sum(a + (b or 0.0) for a, b in busy) if busy and all(a is not None for a, _ in busy) else math.nan
    return Phases(total_s=total_s, setup_s=setup_s, evaluations=evaluations, steps_s=steps_s,
                  first_step_s=float(steps[0]["time/step_s"]) if steps else 0.0, step_parts=parts,
                  predictor_share=parts["predictor"] / steps_s if steps_s > 0 else math.nan,
                  predictor_busy_share=busy_s / steps_s if steps_s > 0 else math.nan, other_s=max(0.0, other))


@dataclass(frozen=True, kw_only=True)
class RunReport:
    """A run's report (:func:`build_run_report`); ``to_dict`` is ``<run>/run_report.json``.

    Attributes:
        title: what was trained where (e.g. ``trace / treerpo on trace_envs/PythonMath-v0``).
        out_dir: the run directory.
        steps: training steps done.
        change: before -> after on the held-out tasks (None without both evaluations).
        samples: episodes per held-out task.
        curve: ``(step, success, standard error)`` of every held-out evaluation.
        effective_ratio, train_success: per step.
        paper_units, generated_tokens: the budget spent.
        phases: where the time went.
        plot: the learning-curve PNG (held-out points with their standard errors in its first panel).
    """

    title: str
    out_dir: str
    steps: int
    change: HeldoutChange | None
    samples: int
    curve: tuple[tuple[int, float, float], ...]
    effective_ratio: tuple[float, ...]
    train_success: tuple[float, ...]
    paper_units: float
    generated_tokens: float
    phases: Phases
    plot: str

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        if self.change is not None:
            data["change"].update(interval=list(self.change.interval), beyond_noise=self.change.beyond_noise)
        return data

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, default=float)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunReport:
        """The report :meth:`to_dict` wrote (plain JSON values only; nothing is evaluated)."""
        c = data.get("change")
        change = None
        if c is not None:
            names = [f for f in HeldoutChange.__dataclass_fields__]
            kept = {k: c[k] for k in names if k in c}
            change = HeldoutChange(**{**kept, "newly_solved": tuple(kept.get("newly_solved", ())),
                                      "newly_lost": tuple(kept.get("newly_lost", ()))})
        p = dict(data["phases"])
        phases = Phases(**{**p, "evaluations": tuple((int(s), float(t)) for s, t in p["evaluations"]),
                           "step_parts": {str(k): float(v) for k, v in p["step_parts"].items()}})
        return cls(title=str(data["title"]), out_dir=str(data["out_dir"]), steps=int(data["steps"]), change=change,
                   samples=int(data["samples"]), curve=tuple((int(s), float(v), float(e)) for s, v, e in data["curve"]),
                   effective_ratio=tuple(float(x) for x in data["effective_ratio"]),
                   train_success=tuple(float(x) for x in data["train_success"]),
                   paper_units=float(data["paper_units"]), generated_tokens=float(data["generated_tokens"]),
                   phases=phases, plot=str(data["plot"]))


def build_run_report(train: Any, records: Sequence[Mapping[str, Any]], *, title: str, setup_s: float,
                     samples: int) -> RunReport:
    """The report of a finished run: ``train`` is its :class:`~trace_agent.run.TrainReport`.

    ``records`` are its ``metrics.jsonl`` records, ``setup_s`` the seconds before its first
    evaluation or step, ``samples`` the episodes per held-out task.
    """
    change = heldout_change(train.before, train.after) if train.before and train.after else None
    curve = tuple((int(r["step"]), float(r["eval/success"]), finite_float(r.get("eval/success_se")) or 0.0)
                  for r in records if finite_float(r.get("eval/success")) is not None)
    return RunReport(title=title, out_dir=str(train.out_dir), steps=int(train.steps), change=change, samples=samples,
                     curve=curve, effective_ratio=tuple(train.effective_ratio),
                     train_success=tuple(train.train_success), paper_units=float(train.paper_units),
                     generated_tokens=float(train.generated_tokens),
                     phases=run_phases(records, total_s=float(train.wall_seconds), setup_s=setup_s),
                     plot=str(train.plot))


def _f(x: float, spec: str = ".2f") -> str:
    return "nan" if not math.isfinite(x) else format(x, spec)


def _ids(ids: Sequence[str], limit: int = 6) -> str:
    shown = ", ".join(ids[:limit])
    return f" ({shown}{', ...' if len(ids) > limit else ''})" if ids else ""


def format_run_report(report: RunReport) -> list[str]:
    """The report as printed lines (no trailing newlines)."""
    lines = [f"=== {report.title}: report ({report.out_dir}) ==="]
    c = report.change
    if c is not None:
        lo, hi = c.interval
        lines += [
            f"held-out success ({c.tasks} tasks x {report.samples} samples): {c.before:.3f} ± {c.before_se:.3f} -> "
            f"{c.after:.3f} ± {c.after_se:.3f}; gain {c.gain:+.3f} ± {c.gain_se:.3f} "
            f"(95% interval {lo:+.3f} .. {hi:+.3f})",
            f"tasks solved at least once: {c.solved_before} -> {c.solved_after}; newly solved "
            f"{len(c.newly_solved)}{_ids(c.newly_solved)}, newly lost {len(c.newly_lost)}{_ids(c.newly_lost)}"
            + ("" if c.paired else " (per-task rates missing: not counted)"),
            c.verdict(),
        ]
    else:
        lines.append("held-out success: not evaluated before and after")
    if len(report.curve) > 2:
        lines.append("held-out success by step: " + " ".join(f"{s}:{v:.3f}" for s, v, _ in report.curve))
    lines.append("effective ratio per step: " + " ".join(_f(x) for x in report.effective_ratio))
    lines.append("train rollout success per step: " + " ".join(_f(x) for x in report.train_success))
    p = report.phases
    evals = ", ".join(f"step {s} {sec:.0f}s" for s, sec in p.evaluations) or "none"
    parts = ", ".join(f"{k} {v:.0f}s" for k, v in p.step_parts.items())
    lines += [
        f"time: {p.total_s:.0f}s run = set-up {p.setup_s:.0f}s (policy load, predictor copy) + evaluations "
        f"{p.evaluations_s:.0f}s ({evals}) + {report.steps} steps {p.steps_s:.0f}s (first {p.first_step_s:.0f}s; "
        f"{parts}) + checkpoints/saving {p.other_s:.0f}s",
        f"predictor share of step wall-clock: {_f(100 * p.predictor_share, '.1f')}% (what the steps waited for it; "
        f"inside its calls, mostly beside generation and env calls: {_f(100 * p.predictor_busy_share, '.1f')}%)",
        f"budget: {report.paper_units:.0f} paper units, {report.generated_tokens:.0f} generated tokens",
        f"learning curve: {report.plot}",
    ]
    return lines


def load_run_report(run_dir: str | Path) -> RunReport:
    """The report of the run in ``run_dir`` (its :data:`REPORT_FILE`).

    Raises:
        FileNotFoundError: the run has no report (it did not finish: resume it to get one).
    """
    path = Path(run_dir) / REPORT_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: the run did not finish (trace-gym train --resume {run_dir})")
    return RunReport.from_dict(json.loads(path.read_text(encoding="utf-8")))


def print_run_report(run_dir: str | Path, *, file: TextIO | None = None) -> RunReport:
    """Print the report of the run in ``run_dir`` (what ``trace-gym train`` and ``make demo`` end with)."""
    report = load_run_report(run_dir)
    print("\n" + "\n".join(format_run_report(report)), file=file or sys.stdout, flush=True)
    return report
