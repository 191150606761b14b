"""Deterministic text corpus for checking the C++ tokenizer against tiktoken (spec §10.1).

build_corpus(gsm8k_dir, special_names) returns a list of (label, text) segments, each encoded on
its own by both sides. It covers:
  - all GSM8K question and answer text (test + train) per field, and the test split in long
    joined blocks;
  - hand-written sentences in many scripts, and seeded synthetic multilingual text;
  - emoji (ZWJ sequences, skin tones, flags, keycaps), combining marks, RTL text;
  - every whitespace the pattern or Python's isspace() treats specially (NBSP, U+3000, U+0085,
    U+2028, U+180E, U+001C..U+001F, \\r\\n mixes) and long whitespace and digit runs;
  - contractions in every case ('S 'T 'Re 'VE 'lL ...), U+017F after an apostrophe;
  - the special-token strings as plain text (whole, partial, nested, adjacent);
  - runs of more than 25,000 whitespace / non-whitespace characters and a segment longer than
    400,000 characters with a special token across the cut (NeMo's long-input splitting);
  - seeded random strings over an alphabet of characters from every class the pattern uses.
Only valid Unicode scalar values appear (tiktoken encodes Python str).
"""

import json
import os
import random

HANDWRITTEN = [
    "Hello world",
    "你好世界",
    "The capital of France is",
    "我们今天去北京大学参观了图书馆，然后在食堂吃了午饭。",
    "東京は日本の首都です。ひらがなとカタカナ、そして漢字を使います。",
    "안녕하세요, 저는 학생입니다. 한국어를 배우고 있어요!",
    "Привет, мир! Как дела? Всё хорошо, спасибо.",
    "Καλημέρα κόσμε· η γλώσσα μας είναι ελληνική.",
    "مرحبا بالعالم، كيف حالك اليوم؟ ١٢٣٤٥٦٧٨٩٠",
    "שלום עולם! מה שלומך היום?",
    "नमस्ते दुनिया। मैं हिंदी सीख रहा हूँ। १२३४५",
    "สวัสดีชาวโลก ภาษาไทยไม่มีช่องว่างระหว่างคำ",
    "Xin chào thế giới! Tiếng Việt có nhiều dấu thanh.",
    "Ünïcödé façade naïve coöperate résumé Ångström Øre straße ẞ",
    "Mixed 中文English混合text with 数字123和symbols!?",
    "日本語とEnglishが混ざった文章です。Version 2.0をリリースしました。",
    "emoji 😀😃😄 👍🏽 👨‍👩‍👧‍👦 🇯🇵🇺🇸 1️⃣ #️⃣ ❤️‍🔥 🏳️‍🌈",
    "combining: e\u0301 a\u0308 n\u0303 \u0915\u094d\u0937 \u05e9\u05c1 x\u20dd",
    "zero width: a\u200bb\u200cc\u200dd\ufeffe \u2060f",
    "fullwidth ＡＢＣ ａｂｃ １２３ ！？",
    "numbers: ² ³ ½ ¼ Ⅻ ⅷ ① ⑳ ٣ ۴ ߅ ๓ ໔ ༥ 〇 〡 𝟘𝟙𝟚",
    "Han-ish: 々 〻 〆 ㈱ ㊣ 〇一二三 ⺀⺁ ⼀⼁ 㐀 𠀀 𪜀 𫝀 𫠠 𬺰 𰀀 𱍐 𲎯",
    "new in Unicode 15/16: 𱍐𱍑 \U0002EBF0\U0002EBF1 \U00010D40\U00010D41 \U00011F50 \U00016D70 "
    "\U00013460\U00013461 \u1C89\u1C8A \uA7CB\uA7DC",
    "spaces:\u00a0nbsp\u3000ideographic\u2003em\u2009thin\u202fnarrow\u205fmath\u1680ogham",
    "breaks:\u0085nel\u2028line\u2029para\r\nwin\rmac\n\nunix\x0bvt\x0cff",
    "controls:\x1c\x1d\x1e\x1f\x00\x01\x07\x1b[0m\x7f",
    "mongolian\u180evowel separator \u180e \u180e\u180e",
    "I'm you're he's she'd we'll they've it's don't can't won't",
    "I'M YOU'RE HE'S SHE'D WE'LL THEY'VE IT'S DON'T CAN'T WON'T",
    "i'M yOu'Re hE'S sHe'D wE'lL tHeY'vE iT'S dOn'T 'S 'T 'Re 'VE 'M 'LL 'D 'll 'd",
    "apostrophes: rock'n'roll o'clock y'all ma'am '90s 'tis l'homme dell'arte",
    "long s: don'ſ it'ſ ſtraße Kelvin'K 'ſ",
    "curly: don’t it’s ‘quoted’ “double”",
    "code: def f(x):\n    return x ** 2  # square\n\tif a != b && c || d: pass\n",
    "json: {\"key\": [1, 2.5, -3e10, true, null], \"nested\": {\"a\": \"b\"}}",
    "urls: https://example.com/path?q=1&r=2#frag mailto:someone@example.org",
    "math: ∀x∈ℝ, ∃y: x² + y² ≤ 1 ⇒ |x| ≤ 1; ∑ᵢ aᵢ = ∫₀¹ f(t) dt",
    "digits: 1 12 123 1234 12345 123456 1234567 3.14159 1,000,000 0x1F 1e-9",
    "    leading spaces and trailing spaces    ",
    "tabs\t\tand\t \tmixed \t whitespace\t",
    "\n\n\nnewlines first\n\n\n",
    " \n \n  \n   mixed\r\n\r\n  \r\n",
    "!!!???...,,,;;;:::---___***&&&%%%$$$###@@@",
    "a!b@c#d$e%f^g&h*i(j)k_l+m=n[o]p{q}r|s\\t/u<v>w?x~y`z",
    "CamelCaseWordsAndABCAcronymsXMLHttpRequest iPhone eBay McDonald",
    "ALLCAPS lowercase Titlecase ǅungla ǈ ǋ ᾈ ᾙ",
    "modifier: ʰʱʲ ˢ ꜰ ᵃᵇᶜ aʰ Aʰ ʰa",
    "",
    " ",
    "\n",
    "a",
    "'",
    "'s",
]


def _from_ranges(rng, ranges, n):
    out = []
    for _ in range(n):
        a, b = ranges[rng.randrange(len(ranges))]
        out.append(chr(rng.randint(a, b)))
    return "".join(out)


# Scripts for synthetic words: (name, code point ranges, typical word length).
SCRIPTS = [
    ("latin", [(0x61, 0x7A)], (2, 9)),
    ("latin-upper", [(0x41, 0x5A)], (1, 5)),
    ("latin-ext", [(0xC0, 0xFF), (0x100, 0x17F), (0x61, 0x7A)], (2, 8)),
    ("cyrillic", [(0x430, 0x44F), (0x410, 0x42F)], (2, 9)),
    ("greek", [(0x3B1, 0x3C9), (0x391, 0x3A9), (0x3AC, 0x3AF)], (2, 8)),
    ("arabic", [(0x627, 0x64A), (0x64B, 0x652)], (2, 7)),
    ("hebrew", [(0x5D0, 0x5EA)], (2, 6)),
    ("devanagari", [(0x905, 0x939), (0x93E, 0x94D)], (2, 7)),
    ("thai", [(0xE01, 0xE2E), (0xE30, 0xE3A), (0xE40, 0xE4E)], (3, 12)),
    ("hangul", [(0xAC00, 0xD7A3)], (1, 4)),
    ("hiragana", [(0x3041, 0x3096)], (1, 6)),
    ("katakana", [(0x30A1, 0x30FA), (0x30FC, 0x30FC)], (1, 6)),
    ("han", [(0x4E00, 0x9FFF)], (1, 6)),
    ("han-ext", [(0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x30000, 0x3134A)], (1, 3)),
    ("emoji", [(0x1F600, 0x1F64F), (0x1F300, 0x1F5FF), (0x1F900, 0x1F9FF), (0x2600, 0x26FF)], (1, 3)),
    ("digits", [(0x30, 0x39)], (1, 7)),
    ("other-digits", [(0x660, 0x669), (0x966, 0x96F), (0xFF10, 0xFF19), (0x1D7CE, 0x1D7FF)], (1, 5)),
    ("marks", [(0x300, 0x36F), (0x61, 0x7A)], (2, 6)),
]
PUNCT = [",", ".", "!", "?", ";", ":", "，", "。", "、", "！", "？", "「", "」", "—", "…", "(", ")",
         "\"", "'", "«", "»", "·", "-", "/", "%", "$", "€", "¥", "@", "#", "&", "*", "<", ">"]
SPACES = [" "] * 20 + ["  ", "\n", "\t", "\u3000", "\u00a0", "\r\n", " \n", "\n\n"]


def _lexicon(seed=7, words_per_script=400):
    """A fixed random vocabulary per script, so synthetic text repeats words the way real text
    does (BPE learns real merges from it) while covering every script."""
    rng = random.Random(seed)
    return [[_from_ranges(rng, ranges, rng.randint(lo, hi)) for _ in range(words_per_script)]
            for _, ranges, (lo, hi) in SCRIPTS]


_LEXICON = _lexicon()
# Zipf-like weights: word k of a script is drawn with probability ~ 1/(k+1).
_ZIPF = [1.0 / (k + 1) for k in range(len(_LEXICON[0]))]


def synthetic_text(rng, n_words):
    words = []
    for _ in range(n_words):
        si = rng.randrange(len(SCRIPTS))
        name, ranges, (lo, hi) = SCRIPTS[si]
        if rng.random() < 0.1:  # an unseen word
            w = _from_ranges(rng, ranges, rng.randint(lo, hi))
        else:
            w = rng.choices(_LEXICON[si], weights=_ZIPF)[0]
        if name == "latin" and rng.random() < 0.2:
            w = w.capitalize()
        if rng.random() < 0.05:
            w += rng.choice(["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re"])
        words.append(w)
        if rng.random() < 0.15:
            words.append(rng.choice(PUNCT))
        words.append(rng.choice(SPACES) if rng.random() < 0.9 else "")
    return "".join(words)


# Characters from every class the pattern distinguishes, for random strings.
FUZZ_ALPHABET = (
    list("aAzZsStTrReEvVmMlLdD019'' \t\n\r!.,-_\"\x0b\x0c\x1c\x1f")
    + ["\u00a0", "\u3000", "\u0085", "\u2028", "\u180e", "\u1680", "\u00e9", "\u00c9", "\u01c5",
       "\u02b0", "\u0301", "\u05d0", "\u4e00", "\u3005", "\u3007", "\u3001", "\u2e80", "\u00b2",
       "\u0663", "\u2167", "\uff11", "\u017f", "\u212a", "\U0001f600", "\u200d", "\ufe0f",
       "\U00031350", "\U00010d40", "\U00016fe4", "\U00016ff0", "\u303b", "\u30fc", "\uac00",
       "\u0e01", "\u0e31", "\u0915", "\u094d", "\u20ac", "\ufffd", "\U000e0041", "\ue000"]
)


def fuzz_strings(rng, count, max_len):
    out = []
    for _ in range(count):
        n = rng.randint(1, max_len)
        out.append("".join(rng.choice(FUZZ_ALPHABET) for _ in range(n)))
    return out


def gsm8k_records(gsm8k_dir):
    for split in ("test", "train"):
        with open(os.path.join(gsm8k_dir, split + ".jsonl"), encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    yield split, json.loads(line)


def build_corpus(gsm8k_dir, special_names):
    """special_names: the special-token strings to embed as plain text."""
    rng = random.Random(20250611)
    seg = []

    # GSM8K, per field; the test split also joined into ~100 KB blocks (whitespace context
    # across fields, long inputs).
    block = []
    for split, rec in gsm8k_records(gsm8k_dir):
        seg.append(("gsm8k-question", rec["question"]))
        seg.append(("gsm8k-answer", rec["answer"]))
        if split == "test":
            block.append(rec["question"] + "\n" + rec["answer"])
        if len(block) == 200 or (block and split != "test"):
            seg.append(("gsm8k-block", "\n\n".join(block)))
            block = []

    for t in HANDWRITTEN:
        seg.append(("handwritten", t))
    seg.append(("handwritten-joined", "\n".join(HANDWRITTEN)))

    for _ in range(300):
        seg.append(("synthetic", synthetic_text(rng, rng.randint(5, 400))))

    # Special-token strings as text: whole, partial, nested, adjacent, at the edges.
    names = sorted(special_names)
    for name in names:
        seg.append(("special-text", name))
        seg.append(("special-text", "x" + name + "y"))
    seg.append(("special-text", "".join(names)))
    seg.append(("special-text", " ".join(names)))
    for name in names[:40]:
        seg.append(("special-partial", name[:-1] + " " + name[1:] + " " + name[: len(name) // 2]))
        seg.append(("special-nested", name[:2] + name + name[2:]))
    seg.append(("special-mixed", "<|open|>message role=\"user\"<|sep|>Hi <|open|> there"
                "<|close|>message<|sep|><|end_of_msg|>[BOS][EOS]<|reserved_token_1|>"))

    # Whitespace and digit runs around the pattern's whitespace alternatives.
    for n in (1, 2, 3, 7, 64, 1000):
        for ws in (" ", "\t", "\n", "\r\n", "\u3000", "\u00a0", " \n"):
            seg.append(("ws-run", "a" + ws * n + "b"))
            seg.append(("ws-run-end", "a" + ws * n))
            seg.append(("ws-run-start", ws * n + "b"))
    for n in (1, 2, 3, 4, 5, 6, 7, 10, 100, 1001):
        seg.append(("digit-run", "x" + "7" * n + "y"))
        seg.append(("digit-run", "٣" * n + "1" * n))

    # Long runs (NeMo splits runs of more than 25,000 whitespace / non-whitespace characters).
    for n in (24999, 25000, 25001, 30000):
        seg.append(("long-nonspace", "a" * n))
    seg.append(("long-space", " " * 30000))
    seg.append(("long-newline", "\n" * 26000))
    seg.append(("long-mixed-space", "x" + " \t\u3000\u00a0" * 7000 + "y"))
    seg.append(("long-han", "你好" * 15000))
    seg.append(("long-digits", "1234567890" * 3000))
    seg.append(("long-punct", "!?" * 14000))
    seg.append(("long-isspace-only", "a" + "\x1c" * 26000 + "b"))  # isspace() but not \s
    seg.append(("long-special-cut", "b" * 24990 + "<|open|>" + "c" * 100))
    seg.append(("long-runs-mixed", "word " * 1000 + " " * 25005 + "tail\n" * 100 + "z" * 25007 +
                " end " + "é" * 25003 + "\u3000" * 25001 + "."))
    # > 400,000 characters; a special token and a multi-byte character straddle character
    # 400,000, where NeMo cuts its first chunk.
    words = synthetic_text(rng, 2000)
    long_text = (words * (400000 // len(words) + 1))[:399996]
    long_text += "<|open|>" + "é漢" + (words * 3)[:50000]
    seg.append(("long-400k", long_text))

    for s in fuzz_strings(rng, 4000, 40):
        seg.append(("fuzz", s))
    seg.append(("fuzz-long", "".join(fuzz_strings(rng, 300, 200))))
    return seg


# ---------------------------------------------------------------------------------------------
# Unicode probes: every code point of planes 0-3 and 14 in contexts that reveal which of the
# pattern's classes it belongs to (Han, letter classes, \p{N}, \s, symbol, contraction letter).

PROBE_CONTEXTS = [
    ("han", "你", ""),
    ("lower", "a", ""),
    ("upper", "A", ""),
    ("digit", "1", ""),
    ("symbol", "!", ""),
    ("symbols", "!!", ""),
    ("tab", "\t", ""),
    ("prefix", "", "a"),
    ("contraction", "a'", ""),
]


def probe_code_points():
    return [c for c in range(0x110000)
            if (c >> 16) in (0, 1, 2, 3, 14) and not 0xD800 <= c <= 0xDFFF]


def probe_vocab():
    """Byte tokens, then each context's own merges, then "context + byte" and "byte + context"
    glue tokens: a probe's ids then show where the pre-tokenizer cut it, without a token per
    probe. The context's own merges rank first so BPE builds the context before gluing it."""
    vocab = [bytes([b]) for b in range(256)]
    seen = set(vocab)

    def add(t):
        if t not in seen:
            seen.add(t)
            vocab.append(t)

    for _, pre, post in PROBE_CONTEXTS:
        for ctx in (pre.encode(), post.encode()):
            for k in range(2, len(ctx) + 1):
                add(ctx[:k])
    for _, pre, post in PROBE_CONTEXTS:
        for b in range(256):
            if pre:
                add(pre.encode() + bytes([b]))
            if post:
                add(bytes([b]) + post.encode())
    return vocab
