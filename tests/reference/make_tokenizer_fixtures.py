#!/usr/bin/env python3
"""Golden tokenizer fixtures for xserv, made with Hugging Face `tokenizers` and `transformers`.

Writes, into OUT_DIR (flat):
  gpt2.jsonl, qwen3.jsonl     {"text", "ids"[, "split_special"][, "decoded"]} per line: ids from
                              tokenizers' Tokenizer.encode(text, add_special_tokens=False);
                              "split_special" marks cases run with encode_special_tokens=True
                              (special tokens encoded as plain text); "decoded" is decode(ids)
                              when it differs from text (NFC changes the text).
  decode_gpt2.jsonl,
  decode_qwen3.jsonl          {"ids", "text", "text_skip"}: decode(ids) of seeded random id
                              sequences (partial UTF-8 characters, special tokens), without and
                              with skip_special_tokens.
  chat_qwen3.jsonl            {"messages", "add_generation_prompt", "enable_thinking", "text"}:
                              transformers' apply_chat_template(tokenize=False); enable_thinking
                              null means the argument was not passed.
The first line of every file is {"meta": {...}}: this script, its seed and the library versions.

Usage (on the GPU machine, after `source .devdeps/env.sh`):
  python3 tests/reference/make_tokenizer_fixtures.py --tokenizers "$XSERV_TOKENIZERS" --out "$OUT"
  python3 tests/reference/make_tokenizer_fixtures.py --dry-run   # only the generated strings
"""

import argparse
import hashlib
import json
import os
import platform
import random
import sys

SEED = 20261130
SCRIPT = "tests/reference/make_tokenizer_fixtures.py"

ENGLISH = [
    "Hello world",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "I'm sure you've heard: they'll say it's fine, but we'd rather not.",
    "DON'T SHOUT! I'M LISTENING, AREN'T I? YOU'LL SEE. SHE'D KNOW. THEY'RE HERE. WE'VE WON.",
    "It's John's book, not Mary's; isn't it?",
    "'s 't 're 've 'm 'll 'd",
    "''s '''t",
    "rock 'n' roll, 'tis the season",
    "Mr. Smith paid $1,234.56 on 2024-01-15 at 3:45pm (approx. 20% off).",
    "e-mail: someone@example.com, url: https://example.org/path?q=1&x=y#frag",
    "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak.\n",
    "Well... that's it -- really?! \"Quoted\" and 'single' and `backtick`.",
    "A sentence with    multiple   spaces and\ttabs\tand trailing spaces   ",
    "   leading spaces",
    "CamelCaseWordsAndALLCAPS and snake_case_words and kebab-case-words",
    "naïve café résumé coöperate façade Zürich São Paulo",
    "Ünïcödé lètters wïth àccents: Ærøskøbing, Łódź, Dvořák, İstanbul, straße",
    "Straße STRASSE ǅungla ﬁne ﬀ ligatures",
    "The year 1999 and 2000; numbers like 007, 3.14159 and 6.022e23.",
    "Hello world\nHello world\r\nHello world\rHello world",
    "OpenAI's GPT-2 and Alibaba's Qwen3 tokenizers: byte-level BPE.",
    "xserv is an embeddable C++20 LLM inference library with a stable C ABI.",
]

CODE = [
    "def fib(n):\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "#include <vector>\n\nint main(int argc, char** argv) {\n  std::vector<int> v{1, 2, 3};\n  return v.size() > 2 ? 0 : 1;\n}\n",
    '{"name": "xserv", "version": [0, 1, 0], "tags": ["llm", "c++"], "ok": true, "x": null}',
    "SELECT id, name FROM users WHERE age >= 18 AND name LIKE '%son' ORDER BY id DESC;",
    "    \n    \n\n        x = 1\n",
    "if x:\r\n    y = 2\r\n\r\n",
    "a=b+c*d/e-f%g^h|i&j~k!l<m>n?o:p;q,r.s@t#u$v`w'x\"y\\z",
    "fn main() -> Result<(), Box<dyn Error>> {\n    println!(\"{:?}\", vec![1u8; 4]);\n    Ok(())\n}",
    "<div class=\"a\">\n  <p>Hello &amp; welcome</p>\n</div>",
    "x <<= 2; y >>= 3; z **= 4; w //= 5; v !== u; t ===s; r => q; p -> o; n :: m",
    "// comment\n/* block\n   comment */\n# shell comment\n-- sql comment\n",
    "\t\t\tindented with tabs\n\t \t mixed\n",
    "import numpy as np\nx = np.zeros((3, 4), dtype=np.float32)  # shape (3, 4)\n",
    "$ ls -la /usr/local/bin | grep -E '^d' > out.txt 2>&1 &&echo done",
]

WHITESPACE = [
    " ", "  ", "   ", "\t", "\n", "\r\n", "\r", "\n\n", "\n\n\n\n", " \n", "\n ", " \n ",
    "a b", "a  b", "a   b", "a    b", "a \n b", "a\n\nb", "a\r\n\r\nb", "a \r\n b", "a\t\tb",
    "a\t b", "a \tb", "  a", "a  ", "a\n", "\na", " a ", "\u00a0", "a\u00a0b", "a\u00a0 b",
    "\u3000", "a\u3000b", "\u2028", "a\u2029b", "\u0085", "a\u0085b", "a \u0085 b", "\x0b\x0c",
    "a\x0bb\x0cc", "\u2000\u2001\u2002\u200a", "a\u200bb", "\u202f\u205f", "x\u1680y",
    "hello \n\n world", "end.   \n", "tab\t\n", " \t \t ", "\n\r\n\r", "a\r\r\nb",
]

DIGITS = [
    "0", "12", "123", "1234", "12345678901234567890", "3.14159", "1,000,000", "-42", "+1e-10",
    "a1b2c3", "abc123def", "123abc", "(555) 123-4567", "v1.2.3-rc4", "0x1F 0b1010 0o777",
    "١٢٣٤٥", "१२३४", "１２３４", "²³¹", "½ ¾ ⅓", "Ⅻ ⅻ", "①②③", "𝟘𝟙𝟚", "12\u00a0345",
    "2024年1月15日", "第3章", "99%", "$100", "€20,50", "1st 2nd 3rd 4th",
]

CJK = [
    "你好，世界！",
    "我爱自然语言处理。",
    "今天天气很好，我们去公园散步吧。",
    "机器学习是人工智能的一个分支，它使计算机能够从数据中学习。",
    "大规模语言模型推理库需要高效的分词器",
    "日本語のテキストも正しく処理できますか？",
    "ひらがな カタカナ 漢字 ｶﾀｶﾅ",
    "東京は日本の首都です。人口は約1400万人です。",
    "한국어 문장도 토큰화할 수 있습니다.",
    "안녕하세요! 만나서 반갑습니다.",
    "「引用」『二重引用』【括弧】《书名》",
    "中文English混合text测试123",
    "繁體中文與簡體中文",
    "𠀀𠀁𪚥𩸽",
    "ㄅㄆㄇㄈ",
]

EMOJI = [
    "😀", "😀😃😄", "👍🏽", "👨‍👩‍👧‍👦", "👩🏽‍💻", "🏳️‍🌈", "🇺🇸🇯🇵🇩🇪", "1️⃣ #️⃣", "❤️", "☺︎",
    "I love 🍕 and 🍣!", "🎉🎉🎉 party", "🧑‍🤝‍🧑", "👁️‍🗨️", "emoji at end 🚀", "🦄x🦄",
]

COMBINING = [
    "e\u0301", "cafe\u0301", "A\u030a", "n\u0303", "o\u0308\u0304", "a\u0323\u0307",
    "a\u0307\u0323", "\u1100\u1161\u11a8", "\u1112\u1161\u11ab\u1100\u1173\u11af",
    "\u212b", "\u2126", "\u00c5", "\u0344", "\uf900", "\u0958", "\u0915\u093c",
    "Vie\u0323\u0302t Nam", "\u0041\u0300\u0041\u0301", "x\u0301\u0301\u0301",
    "\u0301", "\u0301a", "\u3099", "\u304b\u3099", "\u30cf\u309a", "u\u0308ber",
    "\u0065\u0301\u0065\u0301\u0065\u0301", "\u1e9b\u0323", "\u03b1\u0313\u0301",
    "\u05d0\u05b7", "\u0627\u0653", "\u0bca\u0bd7", "\u0cc6\u0cc2",
]

RTL = [
    "مرحبا بالعالم",
    "السلام عليكم ورحمة الله",
    "שלום עולם",
    "עברית ו-English ביחד",
    "العربية 123 والأرقام ٤٥٦",
    "\u200fمرحبا\u200f",
    "\u202bRTL embed\u202c",
    "فارسی: سلام دنیا",
    "اردو: ہیلو",
    "ܫܠܡܐ",
]


def specials_text(rng):
    toks = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>",
            "<tool_call>", "<|fim_prefix|>", "<|vision_pad|>", "<|box_start|>"]
    out = [
        "<|endoftext|>",
        "Hello<|endoftext|>world",
        "Hello <|endoftext|> world",
        "<|endoftext|><|endoftext|>",
        "<|endoftext|",
        "|endoftext|>",
        "<|endoftext|>>",
        "<<|endoftext|>",
        "< |endoftext|>",
        "<|ENDOFTEXT|>",
        "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou are helpful.<|im_end|>",
        "<think>\nreasoning\n</think>\n\nanswer",
        "<think></think>",
        " <|im_end|> ",
        "\n<|im_end|>\n",
        "<|im_start|><|im_end|>",
        "<|im_start",
        "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>",
        "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>",
        "text<|vision_start|><|image_pad|><|vision_end|>text",
        "<|object_ref_start|>x<|object_ref_end|><|box_start|>(1,2)<|box_end|>",
        "<|repo_name|>xserv<|file_sep|>main.cpp",
        "<tool_response>ok</tool_response>",
        "<|quad_start|><|quad_end|><|video_pad|><|fim_pad|>",
        "<|endoftext|>你好<|im_end|>😀",
    ]
    for _ in range(20):
        parts = []
        for _ in range(rng.randint(2, 6)):
            if rng.random() < 0.4:
                parts.append(rng.choice(toks))
            else:
                parts.append(rng.choice(ENGLISH + CJK + WHITESPACE + EMOJI)[: rng.randint(1, 20)])
        out.append("".join(parts))
    return out


# Blocks assigned long ago (before Unicode 11), so that the Unicode versions of PCRE2, utf8proc,
# Oniguruma and Rust's unicode-normalization agree on every letter, digit and space.
RANDOM_BLOCKS = [
    (0x20, 0x7E, 10), (0xA0, 0x24F, 6), (0x250, 0x2FF, 1), (0x300, 0x36F, 4), (0x370, 0x3FF, 2),
    (0x400, 0x4FF, 3), (0x530, 0x58F, 1), (0x5D0, 0x5EA, 2), (0x600, 0x6FF, 3), (0x900, 0x97F, 2),
    (0xE00, 0xE5B, 2), (0x10A0, 0x10FF, 1), (0x1100, 0x11FF, 1), (0x1E00, 0x1FFF, 2),
    (0x2000, 0x206F, 3), (0x2070, 0x209C, 1), (0x20A0, 0x20BF, 1), (0x2100, 0x218B, 1),
    (0x2190, 0x23FF, 1), (0x2460, 0x24FF, 1), (0x2500, 0x27BF, 1), (0x3000, 0x303F, 2),
    (0x3041, 0x3096, 2), (0x3099, 0x30FF, 2), (0x3131, 0x318E, 1), (0x4E00, 0x9FA5, 8),
    (0xAC00, 0xD7A3, 3), (0xF900, 0xFA2D, 1), (0xFB00, 0xFB06, 1), (0xFE30, 0xFE4F, 1),
    (0xFF01, 0xFFEE, 2), (0x1D400, 0x1D4FF, 1), (0x1F300, 0x1F64F, 3), (0x1F680, 0x1F6C5, 1),
    (0x20000, 0x2A6D6, 1),
]


def random_unicode(rng, n):
    total = sum(w for _, _, w in RANDOM_BLOCKS)
    out = []
    for _ in range(n):
        r = rng.uniform(0, total)
        for lo, hi, w in RANDOM_BLOCKS:
            r -= w
            if r <= 0:
                break
        cp = rng.randint(lo, hi)
        if 0xD800 <= cp <= 0xDFFF:
            cp = 0x41
        out.append(chr(cp))
    return "".join(out)


def long_inputs(rng):
    out = [
        " ".join(ENGLISH) * 4,
        "\n".join(CODE) * 3,
        "".join(CJK) * 6,
        "机器学习" * 200,  # one long pre-token: exercises BPE on a long word
        " " * 1000,
        " " * 999 + "x",
        "\n" * 300,
        "\t " * 300,
        "9" * 2000,
        "a" * 3000,
        "ab" * 1500,
        "😀" * 400,
        "e\u0301" * 500,
        "<|endoftext|>" * 50,
        "".join(rng.choice(EMOJI + CJK + RTL + COMBINING) for _ in range(200)),
    ]
    for _ in range(5):
        out.append(random_unicode(rng, rng.randint(1000, 3000)))
    return out


def random_mix(rng, n):
    pools = [ENGLISH, CODE, WHITESPACE, DIGITS, CJK, EMOJI, COMBINING, RTL]
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 5)):
            s = rng.choice(rng.choice(pools))
            if len(s) > 8 and rng.random() < 0.5:
                a = rng.randint(0, len(s) - 1)
                s = s[a: a + rng.randint(1, 30)]
            parts.append(s)
            if rng.random() < 0.3:
                parts.append(rng.choice([" ", "  ", "\n", "\r\n", "\t", "", "'s", "'LL", "."]))
        out.append("".join(parts))
    return out


def make_texts():
    rng = random.Random(SEED)
    texts = [""]
    texts += ENGLISH + CODE + WHITESPACE + DIGITS + CJK + EMOJI + COMBINING + RTL
    texts += specials_text(rng)
    texts += long_inputs(rng)
    # Single characters of every category and all ASCII bytes.
    texts += [chr(c) for c in range(1, 128)]
    texts += [random_unicode(rng, rng.randint(1, 40)) for _ in range(150)]
    texts += random_mix(rng, 200)
    seen, unique = set(), []
    for t in texts:
        if t not in seen:
            seen.add(t)
            unique.append(t)
    return unique


def make_chats():
    think_hist = "<think>\nLet me think.\nStill thinking.\n</think>\n\nThe answer is 4."
    conversations = [
        [{"role": "user", "content": "Hello!"}],
        [{"role": "system", "content": "You are a helpful assistant."},
         {"role": "user", "content": "What is 2+2?"}],
        [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello! How can I help?"},
         {"role": "user", "content": "Tell me a joke."}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
         {"role": "assistant", "content": think_hist}, {"role": "user", "content": "And 3+3?"}],
        [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": think_hist}],
        [{"role": "user", "content": "2+2?"},
         {"role": "assistant", "content": "\n\n<think>\n\nhmm\n\n</think>\n\n\n4"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a</think>b</think>c"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>x<think>y</think>z"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "plain answer"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a1"},
         {"role": "user", "content": "q2"}, {"role": "assistant", "content": "<think>r2</think>a2"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>r1</think>a1"},
         {"role": "assistant", "content": "<think>r2</think>a2"}],
        [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a1"},
         {"role": "assistant", "content": "a2"}],
        [{"role": "system", "content": "sys"}, {"role": "system", "content": "second system"},
         {"role": "user", "content": "u"}],
        [{"role": "user", "content": "weather?"},
         {"role": "assistant", "content": "<think>need a tool</think>calling"},
         {"role": "tool", "content": "{\"temp\": 20}"}, {"role": "tool", "content": "sunny"}],
        [{"role": "user", "content": "weather?"}, {"role": "assistant", "content": "ok"},
         {"role": "tool", "content": "20C"}, {"role": "assistant", "content": "<think>easy</think>It is 20C."},
         {"role": "user", "content": "thanks"}],
        [{"role": "user", "content": "<tool_response>\nresult\n</tool_response>"}],
        [{"role": "user", "content": "real question"}, {"role": "assistant", "content": "<think>t</think>x"},
         {"role": "user", "content": "<tool_response>r</tool_response>"},
         {"role": "assistant", "content": "<think>t2</think>y"}],
        [{"role": "user", "content": ""}],
        [{"role": "system", "content": ""}, {"role": "user", "content": ""},
         {"role": "assistant", "content": ""}],
        [{"role": "user", "content": "你好，请介绍一下你自己。😀"},
         {"role": "assistant", "content": "<think>\n用户在打招呼。\n</think>\n\n你好！我是一个助手。"},
         {"role": "user", "content": "谢谢 \r\n  <|im_end|> inside"}],
        [{"role": "user", "content": "  spaces around  "},
         {"role": "assistant", "content": "\n\nleading newlines"}],
        [{"role": "assistant", "content": "assistant first"}],
        [{"role": "system", "content": "only system"}],
        [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
    ]
    cases = []
    for msgs in conversations:
        for agp in (True, False):
            for et in (None, True, False):
                cases.append((msgs, agp, et))
    return cases


def random_id_seqs(rng, vocab_size, special_ids, n):
    seqs = []
    for _ in range(n):
        seq = []
        for _ in range(rng.randint(1, 20)):
            r = rng.random()
            if r < 0.15 and special_ids:
                seq.append(rng.choice(special_ids))
            elif r < 0.4:
                seq.append(rng.randint(0, 255))  # often single bytes: partial UTF-8
            else:
                seq.append(rng.randint(0, vocab_size - 1))
        seqs.append(seq)
    return seqs


def write_jsonl(path, meta, rows):
    with open(path, "w", encoding="utf-8", newline="\n") as f:
        f.write(json.dumps({"meta": meta}, ensure_ascii=False) + "\n")
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizers", default=os.environ.get("XSERV_TOKENIZERS", "../shared/tokenizers"))
    ap.add_argument("--out", default=".")
    ap.add_argument("--dry-run", action="store_true")
    args = ap.parse_args()

    texts = make_texts()
    chats = make_chats()
    if args.dry_run:
        print(f"{len(texts)} texts, {sum(len(t) for t in texts)} chars; {len(chats)} chat cases")
        for t in texts:
            t.encode("utf-8")  # no lone surrogates
        return

    import tokenizers
    import transformers
    from tokenizers import Tokenizer

    with open(os.path.abspath(__file__), "rb") as f:
        script_sha = hashlib.sha256(f.read()).hexdigest()
    base_meta = {"script": SCRIPT, "script_sha256": script_sha, "seed": SEED,
                 "tokenizers": tokenizers.__version__, "transformers": transformers.__version__,
                 "python": platform.python_version()}
    rng = random.Random(SEED + 1)
    os.makedirs(args.out, exist_ok=True)
    for name in ("gpt2", "qwen3"):
        tok = Tokenizer.from_file(os.path.join(args.tokenizers, name, "tokenizer.json"))
        rows = []
        for i, t in enumerate(texts):
            ids = tok.encode(t, add_special_tokens=False).ids
            row = {"text": t, "ids": ids}
            dec = tok.decode(ids, skip_special_tokens=False)
            if dec != t:
                row["decoded"] = dec
            rows.append(row)
        # Special tokens as plain text (xserv: encode(text, allow_special=false)).
        try:
            tok.encode_special_tokens = True
            for t in texts:
                if "<|" in t or "<think>" in t or "<tool" in t:
                    rows.append({"text": t, "ids": tok.encode(t, add_special_tokens=False).ids,
                                 "split_special": True})
        finally:
            tok.encode_special_tokens = False
        meta = dict(base_meta, tokenizer=name, what="encode", count=len(rows))
        write_jsonl(os.path.join(args.out, f"{name}.jsonl"), meta, rows)

        vocab_size = tok.get_vocab_size(with_added_tokens=True)
        special_ids = sorted(tok.get_added_tokens_decoder().keys())
        drows = []
        for seq in random_id_seqs(rng, vocab_size, special_ids, 150):
            drows.append({"ids": seq, "text": tok.decode(seq, skip_special_tokens=False),
                          "text_skip": tok.decode(seq, skip_special_tokens=True)})
        meta = dict(base_meta, tokenizer=name, what="decode", count=len(drows),
                    vocab_size=vocab_size)
        write_jsonl(os.path.join(args.out, f"decode_{name}.jsonl"), meta, drows)
        print(name, len(rows), "encode rows,", len(drows), "decode rows, vocab", vocab_size)

    try:
        write_chats(args, base_meta, chats)
    except Exception:  # keep the encode fixtures even if the chat part fails
        import traceback
        traceback.print_exc()
        return 1


def write_chats(args, base_meta, chats):
    import transformers

    hf = transformers.AutoTokenizer.from_pretrained(os.path.join(args.tokenizers, "qwen3"))
    crows = []
    for msgs, agp, et in chats:
        kwargs = {} if et is None else {"enable_thinking": et}
        text = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp, **kwargs)
        crows.append({"messages": msgs, "add_generation_prompt": agp, "enable_thinking": et,
                      "text": text})
    meta = dict(base_meta, tokenizer="qwen3", what="apply_chat_template", count=len(crows))
    write_jsonl(os.path.join(args.out, "chat_qwen3.jsonl"), meta, crows)
    print("chat", len(crows), "rows")


if __name__ == "__main__":
    sys.exit(main())
