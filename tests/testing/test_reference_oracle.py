"""What a program is checked against (tlc.testing.oracle): its Variant's reference, a reference the user
names (`--reference module:function`, `reference=` in tlc.testing), or — without a Variant — the program as
written; never attention for a program that does not say it is attention."""
from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest
import torch

from tlc.testing import Shapes, check_interpreter, check_program
from tlc.testing.oracle import ReferenceProblem
from tlc.testing.runner import replay, run_tl_test

ROOT = Path(__file__).resolve().parents[2]
WINDOW = ROOT / "tests" / "testing" / "long" / "sliding_window.tl"
SMALL = ["HeadDim=3", "BM=2", "BN=3"]
MHA = (ROOT / "specs" / "mha_fwd.tl").read_text()

REFS = textwrap.dedent('''
    import torch

    BM, BN = 2, 3


    def window(Q, K, V, *, scale, tiles_back=2):
        """Causal attention over the keys from `tiles_back` key tiles before the query tile's diagonal on."""
        group = Q.shape[1] // K.shape[1]
        K, V = K.repeat_interleave(group, dim=1), V.repeat_interleave(group, dim=1)
        S = Q @ K.transpose(-1, -2) * scale
        i = torch.arange(Q.shape[2])[:, None]
        j = torch.arange(K.shape[2])[None, :]
        first = torch.clamp((i // BM) * BM // BN - tiles_back, min=0) * BN
        S = S.masked_fill(~((j >= first) & (j <= i)), float("-inf"))
        return torch.softmax(S, dim=-1).nan_to_num(0.0) @ V


    def window3(Q, K, V, scale):
        return window(Q, K, V, scale=scale, tiles_back=3)


    def takes_everything(Q, K, V, **inputs):
        assert set(inputs) == {"seqlen_q", "seqlen_k", "scale"}, inputs
        assert inputs["seqlen_q"] == Q.shape[2] and inputs["seqlen_k"] == K.shape[2]
        return window(Q, K, V, scale=inputs["scale"])


    def as_dict(Q, K, V, scale):
        return {"O": window(Q, K, V, scale=scale)}


    def boom(Q, K, V):
        raise ZeroDivisionError("no keys\\nhere")


    def wrong_shape(Q, K, V):
        return Q[..., :2]


    def wrong_kind(Q, K, V):
        return "O"


    def two(Q, K, V):
        return Q, Q


    NOT_A_FUNCTION = 3
''')


@pytest.fixture
def refs(tmp_path, monkeypatch) -> str:
    """A reference module in the current directory, imported by name as --reference imports it."""
    (tmp_path / "tlc_window_refs.py").write_text(REFS)
    monkeypatch.chdir(tmp_path)
    return "tlc_window_refs"


def run(path, examples=30, defines=SMALL, **kw) -> tuple[int, str]:
    lines: list[str] = []
    code = run_tl_test(path, examples=examples, seed=0, defines=defines, out=lines.append, **kw)
    return code, "\n".join(lines)


def test_program_without_variant_is_checked_against_itself_as_written() -> None:
    code, out = run(WINDOW)
    assert code == 0, out
    assert "checked against: the program as written (no Variant); the interpreter after 7 passes" in out, out


def test_program_without_variant_is_not_read_as_attention(tmp_path) -> None:
    """A back-to-back GEMM without its Variant line was compared with attention (KeyError 'Q': every
    example failed); it is its own meaning."""
    text = (ROOT / "specs" / "b2b_gemm_relu.tl").read_text().replace("Param Variant = b2b_gemm\n", "")
    (tmp_path / "b2b.tl").write_text(text)
    code, out = run(tmp_path / "b2b.tl", examples=10, defines=["K1=5", "N2=3", "BM=3", "BN=4"])
    assert code == 0 and "the program as written (no Variant)" in out, out


def test_unknown_variant_is_checked_against_itself(tmp_path) -> None:
    (tmp_path / "w.tl").write_text(WINDOW.read_text().replace("Param dtype", "Param Variant = window\nParam dtype"))
    code, out = run(tmp_path / "w.tl", examples=5)
    assert code == 0 and "the program as written (Variant = window has no built-in reference)" in out, out


def test_your_reference_passes_a_program_that_computes_it(refs) -> None:
    code, out = run(WINDOW, reference=f"{refs}:window")
    assert code == 0, out
    assert f"checked against: your reference {refs}:window; the interpreter before and after 7 passes" in out


def test_inputs_by_keyword_and_a_dict_of_outputs(refs) -> None:
    assert run(WINDOW, examples=10, reference=f"{refs}:takes_everything")[0] == 0
    assert run(WINDOW, examples=10, reference=f"{refs}:as_dict")[0] == 0


def test_your_reference_catches_a_window_one_tile_short_past_two_tiles(refs) -> None:
    """The program reads two key tiles before the diagonal, the reference three: they differ only from
    seqlen_q = 11 on (BM = 2, BN = 3). The counterexample replays against the same reference."""
    code, out = run(WINDOW, reference=f"{refs}:window3")
    assert code == 1 and "broken by the program itself" in out, out
    assert f"checked against: your reference {refs}:window3" in out
    sq = int(re.search(r"seqlen_q=(\d+)", out).group(1))
    assert 11 <= sq <= 17, out  # shrunk toward the first failing length
    command = re.search(r"replay: python -m tlc.testing.runner (\S+) (.*) --reference (\S+) --replay (\S+)", out)
    assert command and command.group(3) == f"{refs}:window3", out
    lines: list[str] = []
    assert replay(command.group(1), command.group(4), SMALL, out=lines.append, reference=command.group(3)) == 1
    assert f"seqlen_q={sq}" in "\n".join(lines)
    assert replay(command.group(1), command.group(4), SMALL, out=lines.append) == 0  # as written: no fault


@pytest.mark.parametrize("function, message", [
    ("boom", "--reference {m}:boom raised ZeroDivisionError: no keys here (at batch=1 heads=1"),
    ("wrong_shape", "--reference {m}:wrong_shape returned shape (1, 1, 1, 2) for 'O'; expected (batch, heads, rows, "
                    "cols) = (1, 1, 1, 3)"),
    ("wrong_kind", "--reference {m}:wrong_kind returned a str; return a tensor"),
    ("two", "--reference {m}:two returned 2 tensor(s); the program stores 1 (O)"),
])
def test_a_reference_that_fails_is_one_line_naming_it(refs, function, message) -> None:
    code, out = run(WINDOW, examples=10, reference=f"{refs}:{function}")
    assert code == 1 and len(out.splitlines()) == 1, out
    assert out.startswith(f"{WINDOW}: error: " + message.format(m=refs)), out
    assert "Traceback" not in out and "FAIL" not in out


@pytest.mark.parametrize("spec, message", [
    ("x", "--reference 'x': no ':'; write MODULE:FUNCTION"),
    ("m:", "--reference 'm:': no function after ':'"),
    (":f", "--reference ':f': no module before ':'"),
    ("tlc_no_such_module_anywhere:f", "no module named 'tlc_no_such_module_anywhere' in the current directory"),
    ("{m}:nope", "module {m} has no 'nope'; it defines as_dict, boom,"),
    ("{m}:NOT_A_FUNCTION", "{m}.NOT_A_FUNCTION is an int, not a function"),
])
def test_a_bad_reference_spec_is_one_line(refs, spec, message) -> None:
    code, out = run(WINDOW, examples=5, reference=spec.format(m=refs))
    assert code == 1 and len(out.splitlines()) == 1 and message.format(m=refs) in out, out
    assert out.startswith(f"{WINDOW}: error: --reference '"), out


def test_a_reference_module_that_fails_to_import_is_one_line(tmp_path, monkeypatch) -> None:
    (tmp_path / "tlc_broken_refs.py").write_text("import tlc_missing_dependency_xyz\n")
    (tmp_path / "tlc_raising_refs.py").write_text("raise RuntimeError('not configured')\n")
    monkeypatch.chdir(tmp_path)
    out = run(WINDOW, examples=5, reference="tlc_broken_refs:f")[1]
    assert "importing tlc_broken_refs raised ModuleNotFoundError: No module named 'tlc_missing_dependency_xyz'" in out
    out = run(WINDOW, examples=5, reference="tlc_raising_refs:f")[1]
    assert out.endswith("importing tlc_raising_refs raised RuntimeError: not configured") and "\n" not in out, out


def test_gpu_check_takes_the_program_as_written_as_its_oracle() -> None:
    """A program without a Variant is not refused by --gpu for its oracle (tlc.testing.gpu_check compares the
    kernel with the program as written, tests/testing/test_gpu_oracle_check.py); without a GPU, --gpu says only
    that, and the CPU checks still run."""
    code, out = run(WINDOW, examples=3, gpu=True)
    assert code == 1, out
    assert "error: --gpu: no CUDA device is visible" in out and "compared only with" not in out
    assert "ok: 3 examples" in out  # the CPU checks still ran


# ---------------------------------------------------------------- the library


def _shapes(sq: int, sk: int) -> Shapes:
    return Shapes(1, 2, 1, {"seqlen_q": sq, "seqlen_k": sk}, {"scale": 0.5})


def test_check_interpreter_does_not_read_a_program_without_variant_as_attention() -> None:
    text = MHA.replace("Param Variant = attention\n", "")
    result = check_interpreter(text, _shapes(5, 7), defines={"HeadDim": 3, "BM": 2, "BN": 3})
    assert not result.ok and "no Param Variant" in result.message and "check_program" in result.message


def test_check_program_against_a_callable_the_variant_and_the_program_as_written(tmp_path) -> None:
    from tlc.reference import attention_reference

    def sdpa(Q, K, V, scale):
        return attention_reference(Q, K, V, scale=scale)

    def causal(Q, K, V, scale):
        return attention_reference(Q, K, V, scale=scale, causal=True)

    defines = {"HeadDim": 3, "BM": 2, "BN": 3}
    no_variant = MHA.replace("Param Variant = attention\n", "")
    for program in (MHA, no_variant, Path(WINDOW)):
        assert check_program(program, _shapes(13, 17), defines=defines).ok
    assert check_program(no_variant, _shapes(13, 17), defines=defines, reference=sdpa).ok
    window = check_program(Path(WINDOW), _shapes(13, 17), defines=defines, reference=causal)
    assert not window.ok and window.where is not None and window.where[2] >= 10  # rows past the window


def test_check_program_raises_a_fault_of_the_reference() -> None:
    def broken(Q, K, V):
        return torch.zeros(1)

    with pytest.raises(ReferenceProblem, match=r"reference=.*broken returned shape \(1,\) for 'O'"):
        check_program(MHA, _shapes(3, 4), defines={"HeadDim": 3, "BM": 2, "BN": 3}, reference=broken)


def test_a_slipped_transpose_without_variant_means_the_one_reading_that_type_checks(tmp_path) -> None:
    """`GEMM Q, K` for `Q, K.T`: the language gives it the one reading resolve-transpose repairs it to
    (specs/LANGUAGE.md), so that pass is not blamed for changing what the program means."""
    text = MHA.replace("Param Variant = attention\n", "").replace("GEMM Q, K.T and", "GEMM Q, K and")
    (tmp_path / "no_t.tl").write_text(text)
    code, out = run(tmp_path / "no_t.tl", examples=10, defines=["HeadDim=8", "BN=8", "BM=4"])
    assert code == 0, out
    assert "the program as written (no Variant; its .T as resolve-transpose reads it)" in out


def test_check_program_takes_a_lowered_graph() -> None:
    from tlc.testing.checks import as_graph

    graph = as_graph(Path(WINDOW), {"HeadDim": 3, "BM": 2, "BN": 3})
    assert check_program(graph, _shapes(13, 17)).ok
    assert check_program(graph, _shapes(13, 17)).ok  # the graph given is left as it was, for the next call
