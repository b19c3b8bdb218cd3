"""Extraction of TL and C++ from free-form answers."""
from __future__ import annotations

from tlc_llm.code import extract_cpp
from tlc_llm.extract import candidates, fenced_blocks, pick_best

PROGRAM = "Param BM = 128\nCopy Q from global to shared\n"


def test_fenced_with_chatter():
    answer = f"Sure! Here you go:\n\n```tl\n{PROGRAM}```\nLet me know."
    (cand,) = candidates(answer)
    assert cand.text == PROGRAM and cand.tag == "tl"


def test_untagged_tilde_and_crlf():
    answer = "text\r\n~~~\r\nParam BM = 64  \r\nCopy Q from global to shared\r\n~~~\r\n"
    (cand,) = candidates(answer)
    assert cand.text == "Param BM = 64\nCopy Q from global to shared\n"


def test_unclosed_fence_runs_to_end():
    (body,) = [b for _, b in fenced_blocks("intro\n```tl\nParam BM = 1\nCopy Q")]
    assert body == "Param BM = 1\nCopy Q"


def test_no_fences_takes_tl_looking_lines():
    answer = "I would write:\nParam BM = 128\nCopy Q from global to shared\n\nThat is all.\nfor is a word"
    (cand,) = candidates(answer)
    assert cand.text == PROGRAM and cand.tag == "<prose>"


def test_foreign_blocks_rank_last_and_prose_only_without_tl_blocks():
    answer = f"```python\nprint(1)\n```\n```tl\n{PROGRAM}```"
    cands = candidates(answer)
    assert [c.tag for c in cands] == ["python", "tl"]
    assert [c.foreign for c in cands] == [True, False]


def test_pick_best_prefers_ok_then_fewer_errors_then_later():
    answer = "```tl\nA\n```\n```tl\nB\n```\n```tl\nC\n```\n```tl\nD\n```"
    cands = candidates(answer)
    scores = {"A\n": (False, 3), "B\n": (False, 1), "C\n": (False, 1), "D\n": (False, 2)}
    best, _ = pick_best(cands, scores.__getitem__, key=lambda r: (r[0], r[1]))
    assert best.text == "C\n"  # tie between B and C: the later block, usually a revision
    scores["A\n"] = (True, 0)
    best, _ = pick_best(cands, scores.__getitem__, key=lambda r: (not r[0], r[1]))
    assert best.text == "A\n"


def test_nothing_to_extract():
    assert candidates("I cannot help with that.") == []
    assert extract_cpp("no code here") is None


def test_extract_cpp_prefers_tagged_last_kernel():
    answer = ("```cpp\n__global__ void a() {}\n```\nbetter:\n```cuda\n__global__ void b() {}\n```\n"
              "```\nint helper;\n```")
    assert extract_cpp(answer) == "__global__ void b() {}\n"
    assert extract_cpp('extern "C" __global__ void k() {}') == 'extern "C" __global__ void k() {}\n'
