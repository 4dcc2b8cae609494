"""``--set`` overrides through trace-gym's config_io beside OmegaConf's structured configs, in one run.

For the same :class:`~trace_agent.config.TrainConfig` and the same override strings, prints what
each parser makes of them (the value, or its error message as printed) and times a load with three
valid overrides. OmegaConf (what verl and Hydra use) is not a dependency of the project: install it
to run this (``pip install omegaconf``)::

    python scripts/bench/config_parsers.py --repeats 7
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from _timing import times_ms  # noqa: E402

from trace_agent.config import TrainConfig  # noqa: E402
from trace_agent.config_io import apply_overrides, config_from_dict, config_to_dict  # noqa: E402

CASES = ("optim.lr=abc", "optim.lr=1e-5x", "optim.betas=[0.9]", "predictor.kind=bogus", "log.wandb=maybe",
         "steps=2.5", "log.wandb=auto", "eval.tasks=null", "optim.lr=1e-5", "rollout.roots='8'")
VALID = ("optim.lr=1e-5", "steps=3", "rollout.strategy=grpo")


def _value(config: TrainConfig, key: str) -> object:
    for part in key.split("."):
        config = getattr(config, part)
    return config


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args(argv)
    try:
        import omegaconf
        from omegaconf import OmegaConf
    except ImportError:
        print("omegaconf is not installed: pip install omegaconf", file=sys.stderr)
        return 2

    def ours(overrides: tuple[str, ...] | list[str]) -> TrainConfig:
        return config_from_dict(TrainConfig, apply_overrides(config_to_dict(TrainConfig()), list(overrides)))

    def theirs(overrides: tuple[str, ...] | list[str]) -> TrainConfig:
        return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TrainConfig), OmegaConf.from_dotlist(
            list(overrides))))

    lines = {"ours": 0, "omegaconf": 0}
    for case in CASES:
        print(case)
        for name, parse in (("ours", ours), ("omegaconf", theirs)):
            try:
                shown = f"ok: {_value(parse([case]), case.split('=')[0])!r}"
            except Exception as exc:  # noqa: BLE001 - printing what each parser says is the point
                text = str(exc).strip()
                lines[name] += len(text.splitlines())
                shown = f"{type(exc).__name__}: " + " | ".join(line.strip() for line in text.splitlines())
            print(f"  {name:>9}: {shown}")
    a = statistics.median(times_ms(lambda: ours(VALID), args.repeats))
    b = statistics.median(times_ms(lambda: theirs(VALID), args.repeats))
    print(f"error lines over the refused cases: ours {lines['ours']}, omegaconf {omegaconf.__version__} "
          f"{lines['omegaconf']}")
    print(f"load with {len(VALID)} overrides: ours {a:.2f} ms, omegaconf {b:.2f} ms ({b / a:.1f}x)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
