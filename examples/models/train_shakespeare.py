#!/usr/bin/env python3
"""Train the small GPT-2-architecture model embedded in examples/models/shakespeare/.

Runs on the GPU machine (torch + transformers there), from the project root:
  source .devdeps/env.sh && python3 examples/models/train_shakespeare.py \
      [--data .devdeps/tinyshakespeare.txt] [--out examples/models/shakespeare] [--time-budget 140]

- data: tinyshakespeare (public domain), tokenized with the real GPT-2 tokenizer
  ($XSERV_TOKENIZERS/gpt2/tokenizer.json, vocab 50257); the last 10% of tokens is held out.
- model: GPT2LMHeadModel, n_embd 128, 6 layers, 4 heads, n_positions 256, gelu_new,
  tied embeddings (about 7.7M parameters; 15.3 MB in float16).
- training: AdamW, linear warmup then cosine decay, bf16 autocast, at most --time-budget
  seconds; the checkpoint with the lowest validation loss is kept.
- output: config.json, generation_config.json, model.safetensors (float16), README.md and
  train_summary.json in --out (the tokenizer files are committed there separately).
"""
import argparse
import json
import math
import os
import time

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, GenerationConfig

EOT = 50256


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=".devdeps/tinyshakespeare.txt")
    ap.add_argument("--out", default="examples/models/shakespeare")
    ap.add_argument("--tokenizer", default=None, help="tokenizer.json (default $XSERV_TOKENIZERS/gpt2)")
    ap.add_argument("--time-budget", type=float, default=140.0, help="seconds of training at most")
    ap.add_argument("--max-steps", type=int, default=2500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--min-lr", type=float, default=1e-4)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--eval-every", type=int, default=100)
    ap.add_argument("--dropout", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=1337)
    args = ap.parse_args()

    torch.manual_seed(args.seed)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    tok_path = args.tokenizer or os.path.join(os.environ["XSERV_TOKENIZERS"], "gpt2", "tokenizer.json")
    tok = Tokenizer.from_file(tok_path)
    assert tok.get_vocab_size() == 50257, tok.get_vocab_size()

    text = open(args.data, encoding="utf-8").read()
    ids = torch.tensor(tok.encode(text).ids, dtype=torch.long)
    n = ids.numel()
    split = int(n * 0.9)
    train, val = ids[:split].to(dev), ids[split:].to(dev)
    print(f"[train] {len(text)} chars -> {n} tokens; train {train.numel()}, val {val.numel()}", flush=True)

    cfg = GPT2Config(vocab_size=50257, n_positions=args.block, n_embd=128, n_layer=6, n_head=4,
                     activation_function="gelu_new", resid_pdrop=args.dropout, embd_pdrop=args.dropout,
                     attn_pdrop=args.dropout, tie_word_embeddings=True, bos_token_id=EOT, eos_token_id=EOT)
    model = GPT2LMHeadModel(cfg).to(dev)
    nparam = sum(p.numel() for p in model.parameters())
    print(f"[train] params {nparam} ({nparam/1e6:.2f}M)", flush=True)

    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=(dev == "cuda"))

    def lr_at(step):
        if step < args.warmup:
            return args.lr * (step + 1) / args.warmup
        t = min(1.0, (step - args.warmup) / max(1, args.max_steps - args.warmup))
        return args.min_lr + 0.5 * (args.lr - args.min_lr) * (1 + math.cos(math.pi * t))

    T, B = args.block, args.batch

    def batch():
        ix = torch.randint(0, train.numel() - T - 1, (B,), device=dev)
        off = torch.arange(T + 1, device=dev)
        chunk = train[ix[:, None] + off[None, :]]
        return chunk[:, :-1], chunk[:, 1:]

    # the whole held-out set, in non-overlapping blocks
    nv = (val.numel() - 1) // T
    vx = val[: nv * T].view(nv, T)
    vy = val[1: nv * T + 1].view(nv, T)

    @torch.no_grad()
    def val_loss(m, autocast=True):
        was_training = m.training
        m.eval()
        tot = 0.0
        for i in range(0, nv, 32):
            with torch.autocast(dev, dtype=torch.bfloat16, enabled=autocast):
                logits = m(input_ids=vx[i:i + 32]).logits
            tot += F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), vy[i:i + 32].reshape(-1),
                                   reduction="sum").item()
        m.train(was_training)
        return tot / (nv * T)

    best = (float("inf"), -1, None)
    t0 = time.time()
    step = 0
    model.train()
    while step < args.max_steps and time.time() - t0 < args.time_budget:
        for g in opt.param_groups:
            g["lr"] = lr_at(step)
        x, y = batch()
        with torch.autocast(dev, dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        loss = F.cross_entropy(logits.float().reshape(-1, logits.size(-1)), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % args.eval_every == 0 or step == args.max_steps:
            vl = val_loss(model)
            if vl < best[0]:
                best = (vl, step, {k: v.detach().clone() for k, v in model.state_dict().items()})
            print(f"[train] step {step:5d} t {time.time()-t0:6.1f}s lr {lr_at(step):.2e} "
                  f"train {loss.item():.4f} val {vl:.4f}{' *' if best[1] == step else ''}", flush=True)
    train_s = time.time() - t0
    print(f"[train] stopped after {step} steps, {train_s:.1f}s; best val {best[0]:.4f} at step {best[1]}", flush=True)
    if best[2] is not None:
        model.load_state_dict(best[2])

    # the shipped checkpoint is float16; measure it as inference will see it (upcast to f32)
    model.eval()
    model = model.to(torch.float16)
    m32 = GPT2LMHeadModel(cfg).to(dev)
    m32.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    m32.eval()
    vl16 = val_loss(m32, autocast=False)
    print(f"[train] val loss of the float16 checkpoint (f32 math): {vl16:.4f} (ppl {math.exp(vl16):.1f})", flush=True)

    samples = []
    gen = torch.Generator(device=dev).manual_seed(0)
    for prompt in ["ROMEO:", "First Citizen:\n", "KING HENRY VI:\nWhat", "JULIET:\nO"]:
        p = torch.tensor([tok.encode(prompt).ids], device=dev)
        with torch.no_grad():
            x = p
            for _ in range(100):  # temperature 0.8, top-k 40
                lg = m32(input_ids=x[:, -T:]).logits[:, -1, :] / 0.8
                v, _ = torch.topk(lg, 40)
                lg[lg < v[:, [-1]]] = -float("inf")
                nxt = torch.multinomial(torch.softmax(lg, -1), 1, generator=gen)
                x = torch.cat([x, nxt], 1)
        s = tok.decode(x[0].tolist())
        samples.append(s)
        print(f"----- sample (T=0.8, top-k 40) -----\n{s}\n", flush=True)
    with torch.no_grad():
        p = torch.tensor([tok.encode("ROMEO:").ids], device=dev)
        g = m32.generate(input_ids=p, attention_mask=torch.ones_like(p), max_new_tokens=60, do_sample=False,
                         pad_token_id=EOT)
    greedy = tok.decode(g[0].tolist())
    print(f"----- greedy -----\n{greedy}\n", flush=True)

    os.makedirs(args.out, exist_ok=True)
    model.config.resid_pdrop = model.config.embd_pdrop = model.config.attn_pdrop = 0.0
    model.save_pretrained(args.out, safe_serialization=True)
    GenerationConfig(bos_token_id=EOT, eos_token_id=EOT).save_pretrained(args.out)
    st = os.path.join(args.out, "model.safetensors")
    from safetensors import safe_open
    from safetensors.torch import save_file
    with safe_open(st, "pt") as f:
        keys = list(f.keys())
        meta = f.metadata() or {"format": "pt"}
        if "lm_head.weight" in keys:  # tied: keep only the input embedding, as GPT-2 checkpoints do
            print("[train] dropping tied lm_head.weight from the checkpoint", flush=True)
            tensors = {k: f.get_tensor(k) for k in keys if k != "lm_head.weight"}
        else:
            tensors = None
    if tensors is not None:
        save_file(tensors, st, metadata=meta)
        keys = list(tensors)
    print(f"[train] tensors: {sorted(keys)}", flush=True)
    size = os.path.getsize(st)
    print(f"[train] wrote {st}: {size} bytes", flush=True)
    assert size < 16_000_000, size

    summary = {"params": nparam, "steps": step, "train_seconds": round(train_s, 1), "best_step": best[1],
               "val_loss_bf16_autocast": round(best[0], 4), "val_loss_f16_checkpoint": round(vl16, 4),
               "train_tokens": int(train.numel()), "val_tokens": int(val.numel()), "batch": B, "block": T,
               "lr": args.lr, "min_lr": args.min_lr, "warmup": args.warmup, "max_steps": args.max_steps,
               "dropout": args.dropout, "seed": args.seed, "torch": torch.__version__,
               "transformers": transformers.__version__,
               "device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
               "samples": samples, "greedy_romeo": greedy}
    json.dump(summary, open(os.path.join(args.out, "train_summary.json"), "w"), indent=1)
    with open(os.path.join(args.out, "README.md"), "w") as f:
        f.write(f"""# shakespeare: a tiny GPT-2 trained on tinyshakespeare

A small GPT-2-architecture model (GPT2LMHeadModel; n_embd 128, 6 layers, 4 heads, n_positions
{T}, gelu_new, tied input/output embeddings, {nparam/1e6:.2f}M parameters) that xserv embeds as
its example and test model. It writes Shakespeare-like text; it is a toy, not a useful model.

- Made by `examples/models/train_shakespeare.py` (in this repository) on one NVIDIA H200:
  {step} steps of AdamW (batch {B} x {T} tokens, peak lr {args.lr}, warmup {args.warmup}, cosine
  decay, weight decay 0.1, dropout {args.dropout}), bf16 autocast, {train_s:.0f} s of training;
  the checkpoint with the lowest validation loss (step {best[1]}) was kept.
- Data: tinyshakespeare (about 1.1 MB of Shakespeare's plays; public domain), tokenized with
  the GPT-2 tokenizer; the last 10% of the tokens is held out for validation.
- Validation loss (float16 checkpoint, f32 math): **{vl16:.3f}** nats/token (perplexity {math.exp(vl16):.0f}).
- Weights: `model.safetensors` in float16. Tokenizer: the original GPT-2 files (tokenizer.json,
  vocab.json, merges.txt; see LICENSE), vocab 50257, `<|endoftext|>` = 50256.
- Versions: torch {torch.__version__}, transformers {transformers.__version__}.

Sample (temperature 0.8, top-k 40):

```
{samples[0]}
```
""")
    print("[train] done", flush=True)


if __name__ == "__main__":
    main()
