"""Run metrics: JSONL (always), TensorBoard and Weights & Biases (when available), learning-curve PNGs.

:class:`MetricsLogger` writes one JSON object per step to ``metrics.jsonl`` (flat
``name: float`` pairs plus ``step``), mirrors scalars to TensorBoard
(``torch.utils.tensorboard``) and W&B when enabled, and can truncate the JSONL
back to a step on resume (so a resumed run neither loses nor repeats lines). Text
(sample transcripts) and images (tree pictures) go to TensorBoard and W&B beside the
scalars (:meth:`MetricsLogger.log_text`, :meth:`MetricsLogger.log_image`).
:func:`plot_learning_curves` draws the standard panels from a ``metrics.jsonl``, with
error bars where a ``<key>_se`` standard error was logged (held-out success).

W&B: ``pip install wandb``; it logs when ``wandb=True``, or with ``"auto"`` when
``WANDB_MODE`` or ``WANDB_API_KEY`` is set (``WANDB_MODE=offline`` writes under
``<run>/wandb`` without a network; ``wandb sync`` uploads it later). The W&B run id is kept in
``<run>/wandb_id.txt`` so a resumed run continues the same W&B run.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

__all__ = ["MetricsLogger", "read_metrics", "plot_learning_curves", "CURVE_PANELS"]

#: (title, metric keys) of the learning-curve panels.
CURVE_PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("held-out success", ("eval/success",)),
    ("train success", ("rollout/success_rate",)),
    ("effective ratio", ("rollout/effective_ratio",)),
    ("predictor", ("predictor/pre_mse", "predictor/pre_spearman_root", "predictor/pre_spearman_prefix")),
    ("policy loss", ("update/loss",)),
    ("time share", ("time/generation_share", "time/env_share", "time/predictor_share", "time/update_share")),
)


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


class MetricsLogger:
    """Per-step scalar logging to ``<run>/metrics.jsonl`` (+ TensorBoard, + W&B).

    Args:
        run_dir: the run directory.
        tensorboard: also write TensorBoard events under ``<run>/tb``.
        wandb: ``True`` logs to W&B when installed; ``"auto"`` only when it is installed and
            ``WANDB_API_KEY`` or ``WANDB_MODE`` is set; ``False`` never.
        config: run configuration (sent to W&B).
        resume_step: drop JSONL lines with ``step > resume_step`` (a resumed run rewrites them).
    """

    def __init__(self, run_dir: str | Path, *, tensorboard: bool = True, wandb: bool | Literal["auto"] = "auto",
                 config: Mapping[str, Any] | None = None, resume_step: int | None = None) -> None:
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.run_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        self._tb: Any = None
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter

                self._tb = SummaryWriter(str(self.run_dir / "tb"), purge_step=resume_step + 1 if resume_step else None)
            except ImportError:  # pragma: no cover - tensorboard is part of the agent extra
                self._tb = None
        self._wandb: Any = None
        if wandb is True or (wandb == "auto" and (os.environ.get("WANDB_API_KEY") or os.environ.get("WANDB_MODE"))):
            try:
                import wandb as wb
            except ImportError:
                wb = None
            if wb is not None:
                id_file = self.run_dir / "wandb_id.txt"
                run_id = id_file.read_text().strip() if resume_step is not None and id_file.is_file() else None
                run_id = run_id or secrets.token_hex(4)
                id_file.write_text(run_id)
                self._wandb = wb.init(project=os.environ.get("WANDB_PROJECT", "trace-gym"), dir=str(self.run_dir),
                                      config=dict(config or {}), id=run_id, resume="allow",
                                      name=self.run_dir.name)

    def log(self, step: int, metrics: Mapping[str, Any]) -> dict[str, Any]:
        """Write one step's metrics (non-numeric values go to JSONL only); returns the JSON record."""
        record: dict[str, Any] = {"step": int(step)}
        for k, v in metrics.items():
            f = _finite(v)
            record[k] = f if f is not None else (None if isinstance(v, float | int) else v)
        with self.path.open("a", encoding="utf-8") as fh:
            fh.write(json.dumps(record, default=str) + "\n")
        scalars = {k: v for k, v in record.items() if k != "step" and isinstance(v, float)}
        if self._tb is not None:
            for k, v in scalars.items():
                self._tb.add_scalar(k, v, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)
        return record

    def log_text(self, tag: str, text: str, step: int) -> None:
        """A text sample (e.g. a transcript) at ``step``: TensorBoard's text tab (Markdown) and W&B (HTML)."""
        if self._tb is not None:
            # TensorBoard renders Markdown: indent by four spaces to keep the transcript verbatim
            self._tb.add_text(tag, "\n".join("    " + line for line in text.splitlines()), step)
            self._tb.flush()
        if self._wandb is not None:
            import html

            import wandb as wb

            self._wandb.log({tag: wb.Html(f"<pre>{html.escape(text)}</pre>")}, step=step)

    def log_image(self, tag: str, png: str | Path, step: int) -> None:
        """A PNG (e.g. a tree picture) at ``step``, to TensorBoard's image tab and W&B."""
        if self._tb is None and self._wandb is None:
            return
        from matplotlib.image import imread

        pixels = imread(str(png))
        if self._tb is not None:
            self._tb.add_image(tag, pixels[..., :3], step, dataformats="HWC")
            self._tb.flush()
        if self._wandb is not None:
            import wandb as wb

            self._wandb.log({tag: wb.Image(str(png))}, step=step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb is not None:
            self._wandb.finish()
            self._wandb = None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ``metrics.jsonl``."""
    p = Path(path)
    if not p.exists():
        return []
    return [json.loads(line) for line in p.read_text().splitlines() if line.strip()]


def plot_learning_curves(records: Sequence[Mapping[str, Any]] | str | Path, path: str | Path, *,
                         title: str | None = None,
                         panels: Sequence[tuple[str, Sequence[str]]] = CURVE_PANELS) -> Path:
    """Learning curves (one panel per entry of ``panels``, empty ones skipped) as a PNG; returns the path."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    recs = read_metrics(records) if isinstance(records, str | Path) else list(records)
    used = [(t, [k for k in keys if any(_finite(r.get(k)) is not None for r in recs)]) for t, keys in panels]
    used = [(t, ks) for t, ks in used if ks]
    cols = 3
    rows = max(1, math.ceil(len(used) / cols))
    fig = Figure(figsize=(4.2 * cols, 3.2 * rows), dpi=100)
    for i, (panel, keys) in enumerate(used):
        ax = fig.add_subplot(rows, cols, i + 1)
        for k in keys:
            pts = [(r["step"], _finite(r.get(k)), _finite(r.get(f"{k}_se"))) for r in recs
                   if _finite(r.get(k)) is not None]
            xs, ys, ses = zip(*pts)
            if any(e is not None for e in ses):
                ax.errorbar(xs, ys, yerr=[e or 0.0 for e in ses], marker="o", ms=3, capsize=3,
                            label=k.split("/", 1)[-1] + " ± s.e.")
            else:
                ax.plot(xs, ys, marker="o", ms=3, label=k.split("/", 1)[-1])
        ax.set_title(panel)
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        if len(keys) > 1 or any(_finite(r.get(f"{keys[0]}_se")) is not None for r in recs):
            ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    return out
