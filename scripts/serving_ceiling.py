#!/usr/bin/env python3
"""The fastest a serve_bench workload can run on a GPU, from the model's shapes alone.

serve_bench submits C requests of P prompt tokens at once and reports output tok/s = C * N
generated tokens / wall time. No engine can beat the time the hardware needs to
  - prefill the C * P prompt tokens: their GEMM and attention FLOPs at the tensor cores' rate
    (the first generated token comes from this step's logits), and
  - run the N - 1 decode steps: each reads every weight once plus each sequence's K/V so far,
    and multiplies C rows through the weights; a step takes at least the longer of the two
    (roofline), with the context growing by one token a step.
This script prints that bound for two sets of rates: the data sheet's peaks and the best rates
xserv has measured on the same GPU (see docs/benchmarks.md), so a goal above the first line is
unreachable on that hardware and one above the second needs kernels faster than any we run.

  python3 scripts/serving_ceiling.py bench/configs/qwen3-1.7b.json --concurrency 16,64,128
"""
import argparse
import json

# H200 SXM: dense bf16 tensor-core peak and HBM3e bandwidth from the data sheet, and the rates
# measured on it (cuBLASLt prefill GEMMs at 16384 rows, the lm_head's weight stream at batch 1).
RATES = {
    "data sheet (989 TFLOP/s, 4.8 TB/s)": (989e12, 4.8e12),
    "measured best (760 TFLOP/s, 4.4 TB/s)": (760e12, 4.4e12),
}


def shapes(cfg):
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    kv_heads = cfg.get("num_key_value_heads", heads)
    head_dim = cfg.get("head_dim", h // heads)
    inter = cfg["intermediate_size"]
    layers = cfg["num_hidden_layers"]
    per_layer = (h * heads * head_dim          # q
                 + 2 * h * kv_heads * head_dim  # k, v
                 + heads * head_dim * h         # o
                 + 3 * h * inter)               # gate, up, down
    matmul_params = layers * per_layer + cfg["vocab_size"] * h  # + the lm_head
    kv_bytes_per_token = layers * 2 * kv_heads * head_dim * 2   # bf16 K and V
    return matmul_params, kv_bytes_per_token, layers * heads * head_dim


def bound(cfg, c, p, n, flops_rate, bytes_rate):
    params, kv_tok, qk_width = shapes(cfg)
    weight_bytes = 2 * params  # bf16
    # Prefill: 2 FLOPs a weight a token, and causal attention's QK^T and PV (~P^2/2 each).
    prefill_flops = c * (2 * params * p + 2 * qk_width * p * p)
    t = prefill_flops / flops_rate
    for step in range(1, n):
        ctx = p + step  # keys each row attends over in this step
        t += max((weight_bytes + c * ctx * kv_tok) / bytes_rate,
                 (2 * params * c + 4 * qk_width * ctx * c) / flops_rate)
    return c * n / t, prefill_flops / flops_rate, t


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("config", help="a model's config.json (bench/configs/*.json)")
    ap.add_argument("--concurrency", default="16,64,128")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--gen-len", type=int, default=128)
    args = ap.parse_args()
    cfg = json.load(open(args.config))
    print(f"{args.config}: prompt {args.prompt_len}, {args.gen_len} generated, output tok/s bound")
    print("| rates | " + " | ".join(f"{c} at once" for c in args.concurrency.split(",")) + " |")
    print("| --- |" + " ---: |" * len(args.concurrency.split(",")))
    for name, (f, b) in RATES.items():
        cells = []
        for c in map(int, args.concurrency.split(",")):
            tok_s, prefill_s, total_s = bound(cfg, c, args.prompt_len, args.gen_len, f, b)
            cells.append(f"{tok_s / 1e3:.1f}k (prefill {1e3 * prefill_s:.0f} of {1e3 * total_s:.0f} ms)")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
