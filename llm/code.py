"""Pull C++/CUDA source out of a free-form answer (vanilla mode and LLM translation)."""
from __future__ import annotations

from tlc_llm.extract import fenced_blocks

_CPP_TAGS = {"cpp", "c++", "cuda", "cu", "c", "cxx", "hpp", "h"}


def extract_cpp(answer: str) -> str | None:
    """The last block that defines a `__global__` kernel, preferring C++-tagged fences."""
    blocks = [(tag, body) for tag, body in fenced_blocks(answer) if "__global__" in body]
    tagged = [body for tag, body in blocks if tag in _CPP_TAGS]
    chosen = (tagged or [body for _, body in blocks] or [None])[-1]
    if chosen is None and "__global__" in answer and "```" not in answer:
        chosen = answer  # a bare source file with no fences at all
    return chosen.strip() + "\n" if chosen else None
