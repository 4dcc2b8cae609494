"""Can the tiny demo LM learn WikiQA-v0's copy behaviour? A first-turn probe, with and without name swapping.

A WikiQA policy must copy names it has never seen: the question's entity into its first search. This probe
runs the demo build's first-turn phase alone (``DemoTrainConfig.first_turn_steps``: the masked next-token loss
of ``trace_agent.demo.build._train`` on each demonstration's first assistant turn) on the WikiQA preset's
model, then counts the held-out test questions whose greedy first turn is exactly the demonstrator's clean
first search. ``--augment K`` trains on K copies of each demonstration with its names swapped
(:meth:`WikiQADemonstrator.augment`), so that no name can be memorised; ``--augment 0`` is the control.

    .venv/bin/python scripts/bench/wiki_copy_probe.py --steps 1000 --augment 0
    .venv/bin/python scripts/bench/wiki_copy_probe.py --steps 1000 --augment 2

Prints the share of first searches right, three sample outputs, and the final loss.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

ENV_ID = "trace_envs/WikiQA-v0"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--augment", type=int, default=0, help="name-swapped copies per demonstration (0: none)")
    p.add_argument("--probes", type=int, default=40, help="held-out (test) questions probed")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)

    import gymnasium as gym
    import numpy as np
    import torch

    import trace_envs  # noqa: F401  (registers the suite)
    from trace_agent.demo import build as demo_build
    from trace_agent.demo import model as demo_model
    from trace_agent.demo.demonstrators.base import collect_demonstrations
    from trace_agent.demo.demonstrators.wiki import WikiQADemonstrator
    from trace_agent.policy.chat import ChatRenderer

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    preset = demo_build.demo_train_config(ENV_ID)
    demos = collect_demonstrations(ENV_ID, demos_per_task=1, flawed_fraction=preset.flawed_fraction, seed=0,
                                   max_turns=preset.max_turns)
    if args.augment:
        rng = np.random.default_rng(1)
        demos = [WikiQADemonstrator().augment(d, rng) for d in demos for _ in range(args.augment)]
    tokenizer = demo_model.train_demo_tokenizer(demos, vocab_size=preset.model.vocab_size)
    chat = ChatRenderer(tokenizer)
    seqs = [demo_build.first_turn(*demo_build.demonstration_tokens(chat, d)) for d in demos]
    model_cfg = demo_model.DemoModelConfig(vocab_size=preset.model.vocab_size, hidden_size=args.hidden,
                                     num_layers=args.layers, num_heads=max(2, args.hidden // 32),
                                     num_kv_heads=max(1, args.hidden // 64), head_dim=32,
                                     intermediate_size=3 * args.hidden)
    model = demo_model.make_demo_model(tokenizer, model_cfg, seed=0)
    print(f"{len(seqs)} first turns (augment {args.augment}), "
          f"{sum(x.numel() for x in model.parameters()):,} parameters, {time.perf_counter() - t0:.0f}s", flush=True)

    env = gym.make(ENV_ID, tasks="test", max_turns=preset.max_turns).unwrapped
    demonstrator, rng = WikiQADemonstrator(), np.random.default_rng(0)  # the clean first search is deterministic
    probes = []
    for task_id in env.tasks.ids()[:args.probes]:
        env.reset(seed=0, options={"task_id": task_id})
        want = chat.encode(demonstrator.act(env, flawed=False, rng=rng)) + [chat.end_of_turn_id]
        probes.append((list(chat.render(list(env.messages), list(env.tools)).token_ids), want))

    def first_searches_right() -> float:
        model.eval()
        hits = 0
        with torch.no_grad():
            for k, (context, want) in enumerate(probes):
                out = model.generate(torch.tensor([context]), max_new_tokens=len(want) + 2, do_sample=False,
                                     pad_token_id=chat.pad_token_id)[0, len(context):].tolist()
                hits += out[:len(want)] == want
                if k < 3:
                    print(f"    got {tokenizer.decode(out)!r}\n    want {tokenizer.decode(want)!r}", flush=True)
        model.train()
        return hits / len(probes)

    cfg = demo_build.DemoTrainConfig(seed=0, steps=args.steps, batch_size=args.batch, model=model_cfg,
                               env_ids=(ENV_ID,))
    losses = demo_build._train(model, seqs, cfg, pad_id=chat.pad_token_id, log=lambda m: print(m, flush=True))
    right = first_searches_right()
    print(f"after {args.steps} steps of {args.batch} first turns (augment {args.augment}): loss "
          f"{sum(losses[-25:]) / len(losses[-25:]):.3f}, first search right {right:.3f} ({len(probes)} test "
          f"questions), {time.perf_counter() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
