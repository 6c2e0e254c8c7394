#!/usr/bin/env python3
"""Parity of xserv's CUDA backend with Hugging Face transformers on random-weight checkpoints.

Runs on the GPU machine (torch + transformers there), after building xserv:
  python3 tests/reference/cuda_parity.py BUILD_DIR OUT_JSON MODEL_DIR [MODEL_DIR ...]
MODEL_DIRs come from /work/shared/device/make_random_model.py (gpt2, qwen3-0.6b, qwen3-8b: real
shapes, random weights). For each model, seeded random prompts of 16, 100 and 300 tokens go
through BUILD_DIR/tests/cuda/xserv_logits_dump (--device cuda --graphs: prefill, then 32 greedy
tokens, each decode step replayed from a CUDA graph after the first two). HF then runs one
forward over prompt + xserv's greedy tokens (teacher forcing, so positions line up even when the
continuations differ) in the checkpoint's dtype, and its own greedy generate().

Reported per model: max |xserv - hf| / max |hf| over all positions (rel_max), the mean of
|xserv - hf| over the mean |hf| (rel_mean), top-1 agreement of the logits rows, and how many
greedy tokens agree with HF's generate() (leading run). For 16-bit checkpoints HF also runs in
float32 on the upcast weights: the top-1 agreement and rel_max of xserv (bf16) and of HF (bf16)
against that common reference say whether a disagreement is xserv's error or bf16's. Pass
criteria of issue 6: f32 (GPT-2) rel_max <= 1e-3 and identical greedy ids; bf16 top-1 agreement
>= 99%.

Random weights give nearly flat output distributions, where bf16 rounding alone flips many
argmaxes (HF bf16 against HF float32 included). So for 16-bit checkpoints the script also counts
the *decided* positions: rows whose float32 top-1/top-2 margin exceeds twice HF bf16's largest
error on that row (|HF bf16 - HF f32| maxed over the vocabulary), where HF's bf16 top-1 provably
equals its float32 top-1, and reports xserv's top-1 agreement with HF on those rows; and, over
all rows, how often xserv's top-1 token is one HF bf16 could have picked: its HF logit within
that same 2 x error of HF's best (a near-tie).
"""
import json
import os
import subprocess
import sys
import time

import numpy as np
import torch
from transformers import AutoModelForCausalLM

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False

GEN = 32
LENGTHS = (16, 100, 300)


def run(build, model_dir, work):
    cfg = json.load(open(os.path.join(model_dir, "config.json")))
    vocab = cfg["vocab_size"]
    dtype_name = cfg.get("torch_dtype") or cfg.get("dtype") or "float32"
    dtype = getattr(torch, dtype_name.replace("torch.", ""))
    rng = np.random.default_rng(0)
    prompts = [rng.integers(0, vocab, size=n).tolist() for n in LENGTHS]
    prompts_file = os.path.join(work, "prompts.txt")
    with open(prompts_file, "w") as f:
        for p in prompts:
            f.write(json.dumps(p) + "\n")
    prefix = os.path.join(work, "dump")
    t0 = time.time()
    subprocess.run([os.path.join(build, "tests", "cuda", "xserv_logits_dump"), "-m", model_dir,
                    "--prompts", prompts_file, "--out", prefix, "--device", "cuda",
                    "--gen", str(GEN), "--graphs"], check=True)
    xs_seconds = time.time() - t0
    meta = json.load(open(prefix + ".json"))
    raw = np.fromfile(prefix + ".f32", dtype=np.float32)

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).cuda().eval()
    cases = []
    offset = 0
    for p, m in zip(prompts, meta["prompts"]):
        n = len(p) + GEN - 1
        got = raw[offset:offset + n * vocab].reshape(n, vocab)
        offset += n * vocab
        ids = torch.tensor([p + m["greedy"][:-1]], device="cuda")
        with torch.no_grad():
            ref = model(ids).logits[0].float().cpu().numpy()
            hf = model.generate(torch.tensor([p], device="cuda"),
                                attention_mask=torch.ones(1, len(p), dtype=torch.long, device="cuda"),
                                max_new_tokens=GEN, do_sample=False, min_new_tokens=GEN,
                                pad_token_id=0)[0, len(p):].tolist()
        cases.append((p, m, ids, got, ref, hf))
    del model
    torch.cuda.empty_cache()
    # 16-bit checkpoints: HF in float32 on the upcast weights is the common reference, so xserv's
    # bf16 error can be put next to HF's own bf16 error.
    f32 = {}
    if dtype != torch.float32:
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).cuda().eval()
        with torch.no_grad():
            for i, c in enumerate(cases):
                f32[i] = model(c[2]).logits[0].float().cpu().numpy()
        del model
        torch.cuda.empty_cache()

    rel_max, abs_diff_sum, abs_ref_sum, agree, rows, greedy_same, greedy_total = 0.0, 0.0, 0.0, 0, 0, 0, 0
    xs32_agree, hf32_agree, xs32_err, hf32_err = 0, 0, 0.0, 0.0
    decided, decided_agree, within_noise = 0, 0, 0
    exact_greedy = True
    per_prompt = []
    for i, (p, m, ids, got, ref, hf) in enumerate(cases):
        n = got.shape[0]
        diff = np.abs(got - ref)
        scale = float(np.abs(ref).max())
        rel_max = max(rel_max, float(diff.max()) / scale)
        abs_diff_sum += float(diff.mean())
        abs_ref_sum += float(np.abs(ref).mean())
        a = int((got.argmax(-1) == ref.argmax(-1)).sum())
        agree += a
        rows += n
        if i in f32:
            r32 = f32[i]
            xs32_agree += int((got.argmax(-1) == r32.argmax(-1)).sum())
            hf32_agree += int((ref.argmax(-1) == r32.argmax(-1)).sum())
            xs32_err = max(xs32_err, float(np.abs(got - r32).max()) / float(np.abs(r32).max()))
            hf32_err = max(hf32_err, float(np.abs(ref - r32).max()) / float(np.abs(r32).max()))
            top2 = np.partition(r32, -2, axis=-1)[:, -2:]
            margin = top2.max(-1) - top2.min(-1)
            noise = np.abs(ref - r32).max(axis=-1)
            sure = margin > 2.0 * noise
            decided += int(sure.sum())
            decided_agree += int((got.argmax(-1) == ref.argmax(-1))[sure].sum())
            picked = ref[np.arange(n), got.argmax(-1)]
            within_noise += int((picked >= ref.max(-1) - 2.0 * noise).sum())
        lead = 0
        for x, y in zip(m["greedy"], hf):
            if x != y:
                break
            lead += 1
        greedy_same += lead
        greedy_total += GEN
        exact_greedy = exact_greedy and lead == GEN
        per_prompt.append({"prompt_len": len(p), "rel_max": float(diff.max()) / scale,
                           "top1": a / n, "greedy_lead": lead})
    extra = {}
    if f32:
        extra = {"vs_f32_top1_xserv": xs32_agree / rows, "vs_f32_top1_hf_bf16": hf32_agree / rows,
                 "vs_f32_rel_max_xserv": xs32_err, "vs_f32_rel_max_hf_bf16": hf32_err,
                 "decided_rows": decided,
                 "decided_top1": decided_agree / decided if decided else None,
                 "top1_within_bf16_noise": within_noise / rows}
    return {**extra, "model": os.path.basename(model_dir.rstrip("/")), "dtype": dtype_name,
            "backend": meta["backend"], "rows": rows, "rel_max": rel_max,
            "rel_mean": abs_diff_sum / abs_ref_sum, "top1_agreement": agree / rows,
            "greedy_equal_tokens": f"{greedy_same}/{greedy_total}", "greedy_identical": exact_greedy,
            "xserv_seconds": xs_seconds, "prompts": per_prompt}


def main():
    build, out = sys.argv[1], sys.argv[2]
    work = os.environ.get("XSERV_PARITY_WORK", "/tmp/xserv_parity_work")
    os.makedirs(work, exist_ok=True)
    results = []
    for d in sys.argv[3:]:
        r = run(build, d, work)
        results.append(r)
        print("[parity]", json.dumps({k: v for k, v in r.items() if k != "prompts"}), flush=True)
    meta = {"transformers": __import__("transformers").__version__, "torch": torch.__version__,
            "device": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    json.dump({"meta": meta, "results": results}, open(out, "w"), indent=1)
    print("| model | dtype | rel max | rel mean | top-1 | greedy equal | top-1 vs HF f32: xserv / HF bf16 "
          "| top-1 on decided rows | top-1 within bf16 noise |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        vs = (f"{100 * r['vs_f32_top1_xserv']:.1f}% / {100 * r['vs_f32_top1_hf_bf16']:.1f}%"
              if "vs_f32_top1_xserv" in r else "-")
        dec = (f"{100 * r['decided_top1']:.1f}% of {r['decided_rows']}"
               if r.get("decided_top1") is not None else "-")
        tie = f"{100 * r['top1_within_bf16_noise']:.1f}%" if "top1_within_bf16_noise" in r else "-"
        print(f"| {r['model']} | {r['dtype']} | {r['rel_max']:.2e} | {r['rel_mean']:.2e} | "
              f"{100 * r['top1_agreement']:.1f}% | {r['greedy_equal_tokens']} | {vs} | {dec} | {tie} |")


if __name__ == "__main__":
    main()
