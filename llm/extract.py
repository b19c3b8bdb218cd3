"""Pull LLM-TL out of a free-form answer: code fences, chatter, several blocks.

Models wrap code in fences with any tag (or none), add prose before and after, offer a
"corrected version" after a first try, or get cut off mid-fence. We collect every plausible
block and let the caller's checker pick the one that parses best.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Sequence, TypeVar

_FENCE = re.compile(r"^[ \t]*(```+|~~~+)[ \t]*([\w+.-]*)[^\n]*$", re.MULTILINE)
_TL_TAGS = {"", "tl", "llm-tl", "llmtl", "text", "txt", "plain", "plaintext"}
_FOREIGN_TAGS = {"cpp", "c++", "cuda", "c", "cu", "python", "py", "json", "bash", "sh", "diff"}
_TL_LINE = re.compile(
    r"^\s*(param|input|allocate|copy|compute|reshape|for|end|#|//)\b", re.IGNORECASE
)


@dataclass(frozen=True)
class Candidate:
    text: str
    tag: str  # the fence's language tag ("" for none, "<prose>" for unfenced lines)
    index: int  # position in the answer; later blocks are usually revisions

    @property
    def foreign(self) -> bool:
        return self.tag in _FOREIGN_TAGS


def fenced_blocks(answer: str) -> list[tuple[str, str]]:
    """(tag, body) for each fenced block; an unclosed last fence (a cut-off answer) runs to the end."""
    answer = answer.replace("\r\n", "\n").replace("\r", "\n")
    blocks: list[tuple[str, str]] = []
    pos = 0
    while True:
        opening = _FENCE.search(answer, pos)
        if opening is None:
            return blocks
        fence, tag = opening.group(1), opening.group(2).lower()
        closing = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.MULTILINE)
        end = closing.search(answer, opening.end())
        body_end = end.start() if end else len(answer)
        blocks.append((tag, answer[opening.end() + 1 : body_end]))
        if end is None:
            return blocks
        pos = end.end()


def prose_runs(answer: str) -> list[str]:
    """Maximal runs of lines that look like TL statements (an answer with no fences)."""
    runs: list[list[str]] = []
    current: list[str] = []
    for line in answer.splitlines():
        if _TL_LINE.match(line):
            current.append(line)
        elif line.strip() == "" and current:
            current.append(line)
        else:
            if current:
                runs.append(current)
            current = []
    if current:
        runs.append(current)
    return ["\n".join(run).strip("\n") for run in runs if sum(bool(_TL_LINE.match(x)) for x in run) >= 2]


def _normalise(text: str) -> str:
    lines = [line.rstrip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n")]
    while lines and not lines[0]:
        lines.pop(0)
    while lines and not lines[-1]:
        lines.pop()
    return "\n".join(lines) + "\n" if lines else ""


def candidates(answer: str) -> list[Candidate]:
    """Every plausible TL block in `answer`, in order; foreign-tagged blocks only as a last resort."""
    found = [Candidate(_normalise(body), tag, i) for i, (tag, body) in enumerate(fenced_blocks(answer))]
    found = [c for c in found if c.text.strip()]
    if not any(not c.foreign for c in found):
        found += [Candidate(_normalise(run), "<prose>", len(found) + i) for i, run in enumerate(prose_runs(answer))]
    return found


T = TypeVar("T")


def pick_best(cands: Sequence[Candidate], score: Callable[[str], T], key: Callable[[T], tuple]) -> tuple[Candidate, T] | None:
    """The candidate whose `key(score(text))` is smallest; ties go to the later block (a revision)."""
    best: tuple[tuple, Candidate, T] | None = None
    ordered = sorted(cands, key=lambda c: (c.foreign, -c.index))
    for cand in ordered:
        result = score(cand.text)
        rank = (*key(result), cand.foreign, -cand.index)
        if best is None or rank < best[0]:
            best = (rank, cand, result)
    return (best[1], best[2]) if best else None
