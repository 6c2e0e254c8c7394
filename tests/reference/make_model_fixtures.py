#!/usr/bin/env python3
"""Make tiny random-weight models and golden data from Hugging Face transformers for xserv's tests.

Runs where torch + transformers are (the GPU machine; everything here runs on its CPU in float32):
  python3 tests/reference/make_model_fixtures.py OUTDIR [--shakespeare examples/models/shakespeare]
OUTDIR (normally tests/data/models) gets one folder per model:
  tiny-gpt2        GPT-2, vocab 320, n_embd 64, 2 layers, 4 heads, n_positions 128, float32
  tiny-qwen3       Qwen3, vocab 320, hidden 64, 4 q / 2 kv heads, head_dim 32, 2 layers,
                   intermediate 96, untied lm_head, rope_theta 1e6 at the top level of config.json
                   (the form of released Qwen3 checkpoints), float32
  tiny-qwen3-tied  the same shapes, tie_word_embeddings true, rope_theta 250000 inside
                   "rope_parameters" (the form transformers 5 writes), float32
  tiny-qwen3-bf16  like tiny-qwen3 but weights stored in bfloat16, rope in "rope_parameters";
                   golden computed in float32 on the upcast weights
each with config.json, generation_config.json, model.safetensors, golden.json, golden.safetensors;
and OUTDIR/shakespeare/ with golden.json + golden.safetensors for the trained example model
(its float16 checkpoint upcast to float32; logits of the last prompt position only).

golden.json: {"meta": {...}, "cases": [{"prompt_ids", "logit_positions", "greedy_ids"}]}
golden.safetensors: float32 "logits.<case index>" of shape [len(logit_positions), vocab], from one
plain forward over the prompt (attn_implementation="eager"). greedy_ids: 32 new tokens from HF
greedy generate (do_sample=False, no eos), checked against an argmax loop over full forwards.
All weights, norm weights and biases included, are random (seeded) so that logits are not flat.
"""
import argparse
import datetime
import json
import os
import platform
import sys

import torch
import transformers
from safetensors.torch import save_file
from transformers import (AutoModelForCausalLM, GenerationConfig, GPT2Config, GPT2LMHeadModel, Qwen3Config,
                          Qwen3ForCausalLM)

SCRIPT = "tests/reference/make_model_fixtures.py"
VOCAB = 320
NEW = 32
PROMPT_LENS = [1, 5, 17, 40]


def meta(extra=None):
    m = {"script": SCRIPT, "torch": torch.__version__, "transformers": transformers.__version__,
         "python": platform.python_version(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
         "compute": "float32 on CPU, attn_implementation=eager"}
    m.update(extra or {})
    return m


def randomize(model, seed, std=0.08):
    """Every parameter random: matrices N(0, std), norm weights 1 + N(0, 0.1), biases N(0, 0.05)."""
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g, dtype=torch.float32)
            if p.dim() >= 2:
                p.copy_(r * std)
            elif name.endswith("weight"):  # 1-D weights are the norms' (LayerNorm / RMSNorm)
                p.copy_(1.0 + 0.1 * r)
            else:
                p.copy_(0.05 * r)


def pick(build, seed0, cases, dtype=torch.float32, want=8):
    """Try seeds and std values until every case's greedy continuation has >= want distinct tokens
    (random tiny models easily fall into repeating one token, which tests the KV cache poorly).
    build(seed, std) -> randomized float32 model. Returns (model, seed, std, min distinct)."""
    import copy
    best = None
    for std in (0.08, 0.12, 0.16):
        for k in range(8):
            seed = seed0 + 1000 * k
            m = build(seed, std)
            e = copy.deepcopy(m).to(dtype).float().eval()
            score = min(len(set(manual_greedy(e, c["prompt_ids"], NEW))) for c in cases)
            if best is None or score > best[3]:
                best = (m, seed, std, score)
            if score >= want:
                break
        if best[3] >= want:
            break
    print(f"  picked seed {best[1]} std {best[2]}: min distinct greedy tokens {best[3]}", flush=True)
    return best


def manual_greedy(model, ids, n):
    x = torch.tensor([ids])
    with torch.no_grad():
        for _ in range(n):
            nxt = model(input_ids=x).logits[0, -1].argmax()
            x = torch.cat([x, nxt.view(1, 1)], 1)
    return x[0, len(ids):].tolist()


def hf_greedy(model, ids, n):
    x = torch.tensor([ids])
    # no eos anywhere, so nothing stops or bends the 32 greedy steps
    model.generation_config.eos_token_id = None
    model.generation_config.bos_token_id = None
    gc = GenerationConfig(do_sample=False, max_new_tokens=n, min_new_tokens=n, eos_token_id=None,
                          bos_token_id=None, pad_token_id=0, num_beams=1)
    with torch.no_grad():
        out = model.generate(input_ids=x, attention_mask=torch.ones_like(x), generation_config=gc)
    return out[0, len(ids):].tolist()


def golden(model, cases, last_only=False):
    """cases: list of dicts with prompt_ids (and optionally prompt_text). Fills logits and greedy."""
    tensors = {}
    for i, c in enumerate(cases):
        ids = c["prompt_ids"]
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
        pos = [len(ids) - 1] if last_only else list(range(len(ids)))
        c["logit_positions"] = pos
        tensors[f"logits.{i}"] = logits[pos].contiguous()
        mine = manual_greedy(model, ids, NEW)
        try:
            hf = hf_greedy(model, ids, NEW)
        except Exception as e:  # keep going: the argmax loop is the same definition of greedy
            print(f"  !! HF generate failed ({e!r}); using the argmax loop", flush=True)
            hf = mine
        if hf != mine:
            print(f"  !! case {i}: HF generate and argmax loop differ:\n     {hf}\n     {mine}", flush=True)
        assert len(hf) == NEW, len(hf)
        c["greedy_ids"] = hf
        print(f"  case {i}: prompt len {len(ids)}, greedy {hf[:12]}... distinct {len(set(hf))}"
              f"{'' if hf == mine else ' (loop differs)'}", flush=True)
    return tensors


def write(dst, cases, tensors, extra_meta):
    json.dump({"meta": meta(extra_meta), "cases": cases}, open(os.path.join(dst, "golden.json"), "w"))
    save_file(tensors, os.path.join(dst, "golden.safetensors"), metadata={"script": SCRIPT})


def edit_config(dst, fn):
    p = os.path.join(dst, "config.json")
    cfg = json.load(open(p))
    fn(cfg)
    json.dump(cfg, open(p, "w"), indent=2, sort_keys=True)
    return cfg


def reload(dst):
    return AutoModelForCausalLM.from_pretrained(dst, dtype=torch.float32, attn_implementation="eager").eval()


def prompts(seed):
    g = torch.Generator().manual_seed(seed)
    return [{"prompt_ids": torch.randint(0, VOCAB, (n,), generator=g).tolist()} for n in PROMPT_LENS]


def make_gpt2(out, seed=1):
    name = "tiny-gpt2"
    dst = os.path.join(out, name)
    os.makedirs(dst, exist_ok=True)
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=128, n_embd=64, n_layer=2, n_head=4,
                     activation_function="gelu_new", layer_norm_epsilon=1e-5, bos_token_id=VOCAB - 1,
                     eos_token_id=VOCAB - 1, tie_word_embeddings=True)
    cases = prompts(100 + seed)

    def build(s, std):
        torch.manual_seed(s)
        m = GPT2LMHeadModel(cfg).float()
        randomize(m, s, std)
        return m
    m, seed, std, _ = pick(build, seed, cases)
    m.save_pretrained(dst, safe_serialization=True)
    GenerationConfig(bos_token_id=VOCAB - 1, eos_token_id=VOCAB - 1).save_pretrained(dst)
    r = reload(dst)
    t = golden(r, cases)
    write(dst, cases, t, {"model": name, "seed": seed, "std": std, "weights_dtype": "float32"})
    return dst


def make_qwen3(out, name, seed, tied, theta, top_level_theta, dtype):
    dst = os.path.join(out, name)
    os.makedirs(dst, exist_ok=True)
    kw = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=32, max_position_embeddings=128, rms_norm_eps=1e-6,
              attention_bias=False, tie_word_embeddings=tied, bos_token_id=VOCAB - 2, eos_token_id=VOCAB - 1,
              hidden_act="silu", use_sliding_window=False)
    try:
        cfg = Qwen3Config(rope_parameters={"rope_type": "default", "rope_theta": theta}, **kw)
    except TypeError:
        cfg = Qwen3Config(rope_theta=theta, **kw)
    cases = prompts(100 + seed)

    def build(s, std):
        torch.manual_seed(s)
        m = Qwen3ForCausalLM(cfg).float()
        if tied and m.lm_head.weight.data_ptr() != m.model.embed_tokens.weight.data_ptr():
            print("  !! lm_head not tied after construction; tying it by hand", flush=True)
            m.lm_head.weight = m.model.embed_tokens.weight
        randomize(m, s, std)
        return m
    m, seed, std, _ = pick(build, seed, cases, dtype)
    m = m.to(dtype)
    m.save_pretrained(dst, safe_serialization=True)
    GenerationConfig(bos_token_id=VOCAB - 2, eos_token_id=VOCAB - 1).save_pretrained(dst)

    def fix(c):
        rp = c.pop("rope_parameters", None)
        old = c.pop("rope_theta", None)
        if top_level_theta:  # released Qwen3 form
            c["rope_theta"] = theta
            c["rope_scaling"] = None
        else:  # transformers 5 form
            rp = dict(rp or {})
            rp.setdefault("rope_type", "default")
            rp["rope_theta"] = theta
            c["rope_parameters"] = rp
        print(f"  config rope as written by transformers: rope_parameters={rp} rope_theta={old}", flush=True)
    cfg_written = edit_config(dst, fix)
    r = reload(dst)
    # the reloaded model must use the intended theta: inv_freq[1] = theta^(-2/head_dim)
    want = theta ** (-2.0 / 32)
    try:
        got = r.model.rotary_emb.inv_freq.float()[1].item()
        rope_check = "ok" if abs(got - want) < 1e-6 else f"MISMATCH inv_freq[1] {got} want {want}"
    except AttributeError as e:
        rope_check = f"not checked ({e})"
    print(f"  rope check: {rope_check}", flush=True)
    same = torch.equal(r.lm_head.weight, r.model.embed_tokens.weight)
    if same != tied:
        print(f"  !! reloaded lm_head equal to embed_tokens: {same}, but tied={tied}", flush=True)
    t = golden(r, cases)
    write(dst, cases, t, {"model": name, "seed": seed, "std": std, "weights_dtype": str(dtype).replace("torch.", ""),
                          "rope_theta": theta, "rope_form": "top-level rope_theta" if top_level_theta
                          else "rope_parameters.rope_theta", "tie_word_embeddings": tied, "rope_check": rope_check})
    print(f"  config keys: {sorted(cfg_written)}", flush=True)
    return dst


def make_shakespeare(out, model_dir):
    from transformers import AutoTokenizer
    dst = os.path.join(out, "shakespeare")
    os.makedirs(dst, exist_ok=True)
    r = reload(model_dir)
    texts = ["ROMEO:", "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\n",
             "KING RICHARD III:\nNow is the winter of our discontent"]
    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
        enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]
        tok_kind = f"AutoTokenizer ({type(tok).__name__})"
    except Exception as e:
        print(f"  !! AutoTokenizer failed ({e!r}); using tokenizers.Tokenizer", flush=True)
        tok_kind = None
    from tokenizers import Tokenizer
    raw = Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))
    if tok_kind is None:
        enc = lambda s: raw.encode(s, add_special_tokens=False).ids
        tok_kind = "tokenizers.Tokenizer"
    cases = []
    for s in texts:
        ids = enc(s)
        if ids != raw.encode(s, add_special_tokens=False).ids:
            print(f"  !! tokenizer disagreement for {s!r}", flush=True)
        cases.append({"prompt_text": s, "prompt_ids": ids})
    t = golden(r, cases, last_only=True)
    for c in cases:
        print(f"  {c['prompt_text']!r} -> {raw.decode(c['greedy_ids'])!r}", flush=True)
    write(dst, cases, t, {"model": "examples/models/shakespeare", "weights_dtype": "float16 upcast to float32",
                          "tokenizer": tok_kind, "logits": "last prompt position only"})
    return dst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir")
    ap.add_argument("--shakespeare", default="examples/models/shakespeare")
    a = ap.parse_args()
    torch.set_num_threads(min(8, os.cpu_count() or 1))
    print(f"[fixtures] torch {torch.__version__} transformers {transformers.__version__}", flush=True)
    os.makedirs(a.outdir, exist_ok=True)
    print("[fixtures] tiny-gpt2", flush=True)
    make_gpt2(a.outdir)
    print("[fixtures] tiny-qwen3", flush=True)
    make_qwen3(a.outdir, "tiny-qwen3", 2, tied=False, theta=1e6, top_level_theta=True, dtype=torch.float32)
    print("[fixtures] tiny-qwen3-tied", flush=True)
    make_qwen3(a.outdir, "tiny-qwen3-tied", 3, tied=True, theta=250000.0, top_level_theta=False,
               dtype=torch.float32)
    print("[fixtures] tiny-qwen3-bf16", flush=True)
    make_qwen3(a.outdir, "tiny-qwen3-bf16", 4, tied=False, theta=1e6, top_level_theta=False, dtype=torch.bfloat16)
    if a.shakespeare and os.path.exists(os.path.join(a.shakespeare, "model.safetensors")):
        print("[fixtures] shakespeare", flush=True)
        make_shakespeare(a.outdir, a.shakespeare)
    else:
        print(f"[fixtures] no model in {a.shakespeare}; shakespeare golden skipped", flush=True)
    print("[fixtures] done", flush=True)


if __name__ == "__main__":
    sys.exit(main())
