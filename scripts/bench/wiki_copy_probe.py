"""Can the tiny demo LM learn WikiQA-v0's copy behaviour? A first-turn probe, with and without name swapping.

A WikiQA policy must copy names it has never seen: the question's entity into its first search. This
probe trains the demo architecture on the *first turn* of WikiQA demonstrations only (cheap: ~45 tokens
after the shared system prompt) and, every ``--eval-every`` steps, counts the held-out test questions
whose greedy first turn is exactly the demonstrator's clean first search. ``--augment K`` trains on K
copies of each demonstration with its names swapped (:meth:`WikiQADemonstrator.augment`), so that no
name can be memorised.

    .venv/bin/python scripts/bench/wiki_copy_probe.py --steps 1000 --batch 32 --augment 0
    .venv/bin/python scripts/bench/wiki_copy_probe.py --steps 1000 --batch 32 --augment 2

Prints one line per evaluation (step, loss, share of the first searches right) and three sample outputs.
The loop is the demo build's masked next-token loss with the shared prefix computed once a step
(``trace_agent.policy.demo._train``) written out, because the probe evaluates between steps.
"""

from __future__ import annotations

import argparse
import math
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
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--augment", type=int, default=0, help="name-swapped copies per demonstration (0: none)")
    p.add_argument("--eval-every", type=int, default=200)
    p.add_argument("--probes", type=int, default=40, help="held-out (test) questions probed")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)

    import gymnasium as gym
    import numpy as np
    import torch

    import trace_envs  # noqa: F401  (registers the suite)
    from trace_agent.policy import demo
    from trace_agent.policy.chat import ChatRenderer
    from trace_agent.policy.demonstrators.base import collect_demonstrations
    from trace_agent.policy.demonstrators.wiki import WikiQADemonstrator

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    preset = demo.demo_train_config(ENV_ID)
    demos = collect_demonstrations(ENV_ID, demos_per_task=1, flawed_fraction=preset.flawed_fraction, seed=0,
                                   max_turns=preset.max_turns)
    if args.augment:
        rng = np.random.default_rng(1)
        demos = [WikiQADemonstrator().augment(d, rng) for d in demos for _ in range(args.augment)]
    tokenizer = demo.train_demo_tokenizer(demos, vocab_size=preset.model.vocab_size)
    chat = ChatRenderer(tokenizer)
    seqs = []
    for ids, mask in (demo.demonstration_tokens(chat, d) for d in demos):
        end = next(i + 1 for i in range(len(mask) - 1) if mask[i] and not mask[i + 1])  # after the first turn
        seqs.append((ids[:end], mask[:end]))
    shared = min(demo._common_prefix_length([s for s, _ in seqs]), min(m.index(True) for _, m in seqs) - 1)
    prefix = seqs[0][0][:shared]
    model_cfg = demo.DemoModelConfig(vocab_size=preset.model.vocab_size, hidden_size=args.hidden,
                                     num_layers=args.layers, num_heads=max(2, args.hidden // 32),
                                     num_kv_heads=max(1, args.hidden // 64), head_dim=32,
                                     intermediate_size=3 * args.hidden)
    model = demo.make_demo_model(tokenizer, model_cfg, seed=0)
    print(f"{len(seqs)} first turns (augment {args.augment}), shared prefix {shared} tokens, "
          f"{sum(x.numel() for x in model.parameters()):,} parameters, {time.perf_counter() - t0:.0f}s", flush=True)

    env = gym.make(ENV_ID, tasks="test", max_turns=preset.max_turns).unwrapped
    demonstrator, rng = WikiQADemonstrator(), np.random.default_rng(0)
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

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = 30

    def lr_at(step: int) -> float:  # the demo build's schedule: linear warm-up, cosine to 10%
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, args.steps - warmup))))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    picks_rng = np.random.default_rng(0)
    n = len(prefix)
    model.train()
    for step in range(args.steps):
        picks = picks_rng.integers(len(seqs), size=args.batch)
        width = max(len(seqs[i][0]) for i in picks) - n
        ids = torch.full((args.batch, width), chat.pad_token_id)
        labels = torch.full((args.batch, width), -100)
        attention = torch.zeros((args.batch, n + width), dtype=torch.long)
        attention[:, :n] = 1
        for row, i in enumerate(picks):
            seq, mask = seqs[i]
            rest = torch.tensor(seq[n:])
            ids[row, :len(rest)] = rest
            attention[row, n:n + len(rest)] = 1
            labels[row, :len(rest)] = torch.where(torch.tensor(mask[n:]), rest, -100)
        cache = model(input_ids=torch.tensor([prefix]), use_cache=True).past_key_values
        cache.batch_repeat_interleave(args.batch)
        logits = model(input_ids=ids, attention_mask=attention, past_key_values=cache, use_cache=True,
                       position_ids=torch.arange(n, n + width)[None].expand(args.batch, -1)).logits
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 labels[:, 1:].reshape(-1), ignore_index=-100)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        if (step + 1) % args.eval_every == 0 or step == args.steps - 1:
            right = first_searches_right()
            print(f"step {step + 1}: loss {loss.item():.3f}, first search right {right:.3f} "
                  f"({len(probes)} test questions), {time.perf_counter() - t0:.0f}s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
