"""Parse a free-text request ("GQA, causal, head dim 128, bf16") into a `GenRequest`.

The request decides which algorithm text goes into the prompts and which spec in specs/
is the reference for evaluation, so a phrase we cannot read is an error, not a guess; a
feature the variants cannot express (a window, ALiBi, dropout, …) is named by `unhonoured`
so that `tlc gen` says it drops it before it starts.
"""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any

VARIANTS = ("mha", "gqa", "mqa", "mla_prefill", "mla_decode")
DTYPES = ("bf16", "fp16")
ALIGNMENTS = ("top_left", "bottom_right")

_DEFAULT_DIMS = {"mla_prefill": (192, 128), "mla_decode": (576, 512)}
_TARGET_ALIASES = {
    "a100": "sm_80", "a10": "sm_86", "a6000": "sm_86", "rtx3090": "sm_86", "l4": "sm_89",
    "l40": "sm_89", "rtx4090": "sm_89", "h100": "sm_90", "h200": "sm_90", "h20": "sm_90",
    "t4": "sm_75", "rtx8000": "sm_75",
}


class RequestError(ValueError):
    """The request text cannot be read; the message says which part and what is accepted."""


@dataclass(frozen=True)
class GenRequest:
    text: str
    variant: str = "mha"
    causal: bool = False
    alignment: str | None = None  # only meaningful when causal
    d_qk: int = 128
    d_v: int = 128
    dtype: str = "bf16"
    target: str | None = None
    group: str | None = None  # e.g. "32/8" query heads per KV head, when given

    def describe(self) -> str:
        """One line for prompts and logs, e.g. `gqa, causal (top-left), d_qk=128, d_v=128, bf16`."""
        parts = [self.variant]
        if self.group:
            parts.append(f"heads {self.group}")
        if self.causal:
            parts.append(f"causal ({(self.alignment or 'top_left').replace('_', '-')} aligned)")
        else:
            parts.append("non-causal")
        parts.append(f"d_qk={self.d_qk}, d_v={self.d_v}")
        parts.append(self.dtype)
        if self.target:
            parts.append(self.target)
        return ", ".join(parts)

    def slug(self) -> str:
        """A file-name stem: `gqa_causal_d128_bf16`."""
        dims = f"d{self.d_qk}" if self.d_qk == self.d_v else f"d{self.d_qk}x{self.d_v}"
        return "_".join([self.variant, "causal" if self.causal else "full", dims, self.dtype])

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _variant(t: str) -> str:
    if re.search(r"\bmla(?:\b|_)|multi[- ]?head latent|latent attention", t):
        return "mla_decode" if re.search(r"decod", t) else "mla_prefill"
    if re.search(r"\bmqa(?:\b|_)|multi[- ]?query", t):
        return "mqa"
    if re.search(r"\bgqa(?:\b|_)|grouped[- ]?query", t):
        return "gqa"
    return "mha"


def _causal(t: str) -> tuple[bool, str | None]:
    if re.search(r"\b(non[- ]?causal|not causal|no[- ]causal|bidirectional|full attention)\b", t):
        return False, None
    if not re.search(r"\bcausal\b", t):
        return False, None
    if re.search(r"bottom[- _]?right", t):
        return True, "bottom_right"
    if re.search(r"top[- _]?left", t):
        return True, "top_left"
    return True, "top_left"  # SDPA's convention, stated in the prompt so nothing is implicit


def _dims(t: str, variant: str) -> tuple[int, int]:
    d_qk, d_v = _DEFAULT_DIMS.get(variant, (128, 128))
    qk = re.search(r"\bd_?qk\s*[=:]?\s*(\d+)", t)
    v = re.search(r"\bd_?v\s*[=:]?\s*(\d+)", t)
    pair = re.search(r"\b(?:head[ _-]?dims?|hdim|headdim|d)\s*[=:]?\s*(\d+)\s*/\s*(\d+)", t)
    single = re.search(r"\b(?:head[ _-]?dim(?:ension)?s?|hdim|headdim|d)\s*(?:of\s*)?[=:]?\s*(\d+)\b(?!\s*/)", t)
    if pair:
        d_qk, d_v = int(pair.group(1)), int(pair.group(2))
    elif single and not qk:
        d_qk = d_v = int(single.group(1))
    if qk:
        d_qk = int(qk.group(1))
        d_v = int(v.group(1)) if v else d_qk
    elif v:
        d_v = int(v.group(1))
    for name, value in (("d_qk", d_qk), ("d_v", d_v)):
        if value <= 0 or value % 8 or value > 1024:
            raise RequestError(f"head dim {name}={value} must be a positive multiple of 8, at most 1024")
    return d_qk, d_v


def _dtype(t: str) -> str:
    found = set()
    if re.search(r"\b(bf16|bfloat16|bfloat)\b", t):
        found.add("bf16")
    if re.search(r"\b(fp16|f16|float16|half)\b", t):
        found.add("fp16")
    if len(found) > 1:
        raise RequestError("request names both bf16 and fp16; pick one dtype")
    return found.pop() if found else "bf16"


def _target(t: str) -> str | None:
    m = re.search(r"\bsm_?(\d{2,3}a?)\b", t)
    if m:
        return f"sm_{m.group(1)}"
    for alias, target in _TARGET_ALIASES.items():
        if re.search(rf"\b{alias}\b", t):
            return target
    return None


# Features a request may ask for that no variant of tlc gen writes: (what it is, the words that ask
# for it in a normalised request, what the generated kernel does instead). "decode" is MLA decode's
# word, so it is dropped only from other variants.
_UNHONOURED = (
    ("a sliding window", r"\bsliding[- ]?window(?:ed)?\b|\bwindow(?:ed)?(?:\s*(?:size|of|[=:]))*\s*\d*|"
     r"\blocal attention\b", "every query attends to every key (with causal, to every earlier key)"),
    ("ALiBi", r"\balibi\b", "scores get no position bias"),
    ("a logit softcap", r"\bsoft[- ]?cap\w*|\blogit[- ]?cap\w*|\btanh cap\w*",
     "scores are not capped (specs/softcap_fwd.tl is a TL program with one, for tlc build)"),
    ("an attention bias", r"(?<!no )\b(?:relative[- ]position |position |additive |attention |attn )?bias\b|"
     r"\brelative[- ]position\w*", "scores get no bias"),
    ("a mask other than causal", r"(?<!causal )(?<!causal-)(?<!no )\b(?:attention |attn |padding |key[- ]padding |"
     r"custom |document |block[- ]?sparse |boolean |bool |additive |arbitrary )?mask(?:s|ed|ing)?\b",
     "the only mask is causal"),
    ("dropout", r"(?<!no )\bdropout\b", "every probability is kept"),
    ("a paged KV cache", r"\bpaged\b(?:\s*(?:kv[- ]cache|kv|cache|attention))?|\bpage[- ]?tables?\b|"
     r"\bblock[- ]?tables?\b", "K and V are contiguous per head"),
    ("variable-length sequences", r"\bvarlen\b|\bvariable[- ]?length\w*|\bragged\b|\bcu_?seqlens?\b|\bpacked "
     r"sequences\b", "every sequence of a batch has the same length"),
    ("split-KV decode", r"\bdecod(?:e|ing)\b|\bsplit[- ]?kv\b|\bflash[- ]?decoding\b",
     "it is a forward kernel (it runs one query row too, without splitting the keys)"),
    ("an fp8, int8 or fp32 element type", r"\b(?:fp8|float8|e4m3|e5m2|int8|int4|fp32|float32|tf32)\b(?!\s*accum)",
     "tensors are bf16 or fp16 (bf16 unless the request says fp16)"),
    ("the backward pass", r"\bbackward\b|\bbwd\b|\bgradients?\b|\btraining\b", "it computes the forward pass only"),
    ("rotary embeddings", r"\brope\b|\brotary\b", "Q and K are read as given"),
    ("attention sinks", r"\b(?:attention )?sinks?\b", "the softmax has no sink term"),
    ("the log-sum-exp output", r"\blse\b|\blog[- ]?sum[- ]?exp\b", "it writes O only"),
)


def unhonoured(request: GenRequest) -> list[str]:
    """One line per feature the request asks for that the generated kernel will not have, quoting the
    request's words: `'window 256' asks for a sliding window, which tlc gen cannot write yet; …`."""
    t = _normal(request.text)
    lines = []
    for feature, pattern, instead in _UNHONOURED:
        if feature == "split-KV decode" and request.variant == "mla_decode":
            continue
        said = list(dict.fromkeys(m.group(0).strip() for m in re.finditer(pattern, t) if m.group(0).strip()))
        if said:
            words = ", ".join(f"'{w}'" for w in said)
            lines.append(f"{words} asks for {feature}, which tlc gen cannot write yet; the kernel goes without: "
                         f"{instead}")
    return lines


def _normal(text: str) -> str:
    """The request as the readers see it: lower case, commas apart, single spaces."""
    return " ".join(text.lower().replace(",", " , ").split())


def parse_request(text: str, target: str | None = None) -> GenRequest:
    """Read `text`; `target` (from --target) must agree with a target the text names."""
    if not text or not text.strip():
        raise RequestError('empty request: say what to generate, e.g. "GQA, causal, head dim 128, bf16"')
    t = _normal(text)
    variant = _variant(t)
    causal, alignment = _causal(t)
    d_qk, d_v = _dims(t, variant)
    named = _target(t)
    if target and named and named != target:
        raise RequestError(f"request names target {named} but --target is {target}")
    group_match = re.search(r"\b(\d+)\s*/\s*(\d+)\s*(?:heads?)?\b", t) if variant in ("gqa", "mqa") else None
    group = f"{group_match.group(1)}/{group_match.group(2)}" if group_match else None
    return GenRequest(
        text=text.strip(), variant=variant, causal=causal, alignment=alignment, d_qk=d_qk, d_v=d_v,
        dtype=_dtype(t), target=target or named, group=group,
    )
