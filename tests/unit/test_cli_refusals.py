"""Public entries refuse bad arguments in one tlc line naming them (CLI, tlc.build, tlc.precompile,
tlc.attention, shape lists, -D, --sizes); `tlc check` says what `tlc build` would say, per target;
control bytes reach no terminal raw; no choice is made silently."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import tlc
from tlc.cli import main
from tlc.diagnostics import TlcError

ROOT = Path(__file__).resolve().parents[2]
MHA = str(ROOT / "specs" / "mha_fwd.tl")
DECODE = str(ROOT / "specs" / "mla_decode_fwd.tl")   # 16-row blocks: sm_90a refuses it
MHA_TEXT = Path(MHA).read_text()
RAW_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def _with_param(tmp_path: Path, line: str) -> str:
    path = tmp_path / "k.tl"
    path.write_text(MHA_TEXT.replace("Param BN = 64", f"Param BN = 64\n{line}"))
    return str(path)


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


# ---------------------------------------------------------------------- control bytes
def test_control_bytes_in_a_tl_file_are_escaped_in_check(tmp_path, capsys) -> None:
    path = tmp_path / "k.tl"
    path.write_bytes(b"Param BM = 64\n\x1b]0;owned\x07Copy Q from global to shared\n")
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert not RAW_CONTROL.search(err) and "\\x1b]0;owned\\x07" in err


def test_control_bytes_in_a_shapes_line_are_escaped(tmp_path, capsys) -> None:
    shapes = tmp_path / "s.txt"
    shapes.write_bytes(b"d=64 \x1b[2Jdtype=bf16\n")
    assert main(["precompile", "--shapes", str(shapes)]) == 1
    err = capsys.readouterr().err
    assert not RAW_CONTROL.search(err) and "\\x1b[2Jdtype=bf16" in err


def test_control_bytes_in_cli_arguments_are_escaped(capsys) -> None:
    assert main(["build", MHA, "--arch", "sm_\x1b[31m90"]) == 1
    err = capsys.readouterr().err
    assert not RAW_CONTROL.search(err) and "sm_\\x1b[31m90" in err
    with pytest.raises(SystemExit):
        main(["show", MHA, "--emit", "\x1b[31mcute"])
    err = capsys.readouterr().err
    assert not RAW_CONTROL.search(err) and "\\x1b[31mcute" in err


# ---------------------------------------------------------------------- numbers from users
@pytest.mark.parametrize("line", ["d=\u00b2", "d=" + "1" * 5000, "d=\u0661\u0662\u0668", "d=64 hq=1" + "0" * 12],
                         ids=["superscript", "5000-digits", "arabic-indic", "past-32-bits"])
def test_a_shape_list_number_is_refused_in_one_line_not_an_internal_error(tmp_path, capsys, line) -> None:
    shapes = tmp_path / "s.txt"
    shapes.write_text(line + "\n")
    assert main(["precompile", "--shapes", str(shapes)]) == 1
    err = capsys.readouterr().err
    assert re.search(rf"{re.escape(str(shapes))}:1:\d+: error: (d|hq)\b", err)
    assert "internal error" not in err and "set_int_max_str_digits" not in err


@pytest.mark.parametrize("call", [{"d": "\u00b2"}, {"d": 10**5000}, {"d": "1" * 5000}, {10**5000: 1}],
                         ids=["superscript", "huge-int", "5000-digits", "huge-key"])
def test_tlc_precompile_refuses_bad_calls_in_one_line(call) -> None:
    with pytest.raises(TlcError) as info:
        tlc.precompile([call], arch="sm_90")
    assert "tlc.precompile: call 1: " in _one_line(info.value.render())


@pytest.mark.parametrize("kwargs, words", [
    ({"arch": 90}, "tlc.precompile: arch must be a target name"),
    ({"arch": ["sm_90", "sm_75"]}, "tlc.precompile: arch: unknown target 'sm_75'"),
    ({"jobs": -1}, "tlc.precompile: jobs: -1 is out of range"),
    ({"jobs": "4"}, "tlc.precompile: jobs: a whole number is needed, not a str"),
])
def test_tlc_precompile_checks_its_arguments(kwargs, words) -> None:
    with pytest.raises(TlcError) as info:
        tlc.precompile([{"d": 64}], **kwargs)
    assert words in _one_line(info.value.render())


def test_a_json_shape_list_with_a_5000_digit_number_is_refused(tmp_path, capsys) -> None:
    shapes = tmp_path / "s.json"
    shapes.write_text('[{"d": ' + "1" * 5000 + "}]")
    assert main(["precompile", "--shapes", str(shapes)]) == 1
    err = capsys.readouterr().err
    assert "d: '1111" in err and "has 5000 digits" in err and "internal error" not in err


@pytest.mark.parametrize("args, kwargs, words", [
    ((MHA,), {"arch": 90}, "tlc.build: arch must be a target name such as 'sm_90'"),
    ((MHA,), {"arch": "sm_75"}, "tlc.build: arch: unknown target 'sm_75'"),
    ((MHA,), {"arch": "sm_90", "defines": ["HeadDim=64"]}, "tlc.build: defines must be a mapping"),
    ((MHA,), {"arch": "sm_90", "defines": {"BM": 10**5000}}, "tlc.build: defines['BM']: an integer of"),
    ((MHA,), {"arch": "sm_90", "defines": {"BM": None}}, "tlc.build: defines['BM'] is a NoneType"),
    ((MHA,), {"arch": "sm_90", "lse": "yes"}, "tlc.build: lse must be True or False"),
    ((None,), {"arch": "sm_90"}, "tlc.build: path_or_text must be a .tl file"),
    (("kernel.TL",), {"arch": "sm_90"}, "cannot read 'kernel.TL': no such file"),
])
def test_tlc_build_checks_its_arguments_in_one_line(args, kwargs, words) -> None:
    with pytest.raises(TlcError) as info:
        tlc.build(*args, **kwargs)
    assert words in _one_line(info.value.render())


def test_a_str_naming_an_existing_file_is_read_as_the_file_whatever_its_extension(tmp_path) -> None:
    from tlc.runtime import _read

    upper = tmp_path / "kernel.TL"
    upper.write_text(MHA_TEXT)
    assert _read(str(upper)) == (MHA_TEXT.encode(), str(upper))
    assert _read("Param BM = 64") == (b"Param BM = 64", "<text>")   # one line of TL is text
    assert _read(MHA_TEXT)[1] == "<text>"


@pytest.mark.parametrize("flag", ["is_causal", "enable_gqa"])
def test_tlc_attention_refuses_a_flag_that_is_not_a_bool(flag) -> None:
    torch = pytest.importorskip("torch")
    q = torch.zeros(1, 1, 4, 64, dtype=torch.bfloat16)
    with pytest.raises(TlcError) as info:
        tlc.attention(q, q, q, **{flag: "yes"})
    assert f"tlc.attention: {flag} must be True or False, not a str" in _one_line(info.value.render())


@pytest.mark.parametrize("sizes, words", [
    ("5x0", "--sizes 5x0: 0 is out of range; it must be from 1 to 4096"),
    ("3x\u00b2", "'\u00b2' is not a whole number"),
    ("3x" + "1" * 5000, "has 5000 digits"),
], ids=["zero", "superscript", "5000-digits"])
def test_interp_sizes_are_checked_before_anything_runs(capsys, sizes, words) -> None:
    assert main(["interp", MHA, "--sizes", sizes]) == 1
    out = capsys.readouterr()
    assert words in _one_line(out.err) and "Error" not in out.out + out.err


def test_a_5000_digit_define_is_refused_in_tlcs_words(capsys) -> None:
    assert main(["check", MHA, "-D", "BM=" + "1" * 5000]) == 1
    err = capsys.readouterr().err
    assert "-D BM: '1111" in err and "has 5000 digits" in err and "set_int_max_str_digits" not in err


@pytest.mark.parametrize("option", [["-j", "-3"], ["-j", "\u0661"], ["--jobs", "9" * 40]])
def test_a_bad_jobs_count_is_refused_by_the_parser(capsys, option) -> None:
    with pytest.raises(SystemExit) as info:
        main(["build", "/nonexistent/a.tl", "/nonexistent/b.tl", *option])
    assert info.value.code == 2 and "argument -j/--jobs:" in capsys.readouterr().err


# ---------------------------------------------------------------------- check says what build says
@pytest.mark.parametrize("line, words", [
    ("Param ReduceChains = 3", "sm_90, sm_90a: {}:17:1: error: Param ReduceChains = 3: use 1, 2, 4 or 8"),
    ("Param StaticTiles = true", "sm_90, sm_90a: {}:17:1: error: StaticTiles = true needs Persistent = true"),
    ("Param Stages = 99", "sm_90: {}:17:1: error: Param Stages = 99: the cp.async pipeline runs 1 or 2 stages"),
])
def test_check_refuses_schedule_params_every_build_refuses(tmp_path, capsys, line, words) -> None:
    path = _with_param(tmp_path, line)
    assert main(["check", path]) == 1
    err = capsys.readouterr().err
    assert words.format(path) in err


def test_check_refuses_a_program_with_params_and_inputs_only(tmp_path, capsys) -> None:
    path = tmp_path / "k.tl"
    path.write_text("Param BM = 64\nInput seqlen_q : int\n")
    assert main(["check", str(path)]) == 1
    assert f"{path}:1:1: error: the program computes nothing" in capsys.readouterr().err


def test_check_for_an_arch_refuses_what_its_build_refuses_with_the_same_message(tmp_path, capsys) -> None:
    assert main(["build", DECODE, "--arch", "sm_90a", "-o", str(tmp_path)]) == 1   # refused before NVRTC
    built = capsys.readouterr().err
    assert main(["check", DECODE, "--arch", "sm_90a"]) == 1
    checked = capsys.readouterr().err
    assert built.startswith(f"{DECODE}:49:3: error: tlc build (sm_90a): --arch sm_90a runs one warp group")
    assert f"sm_90a: {built}" in checked


def test_check_without_arch_names_the_target_that_refuses(capsys) -> None:
    assert main(["check", DECODE]) == 0   # the sm_80 family builds it
    out = capsys.readouterr()
    assert f"sm_90a: {DECODE}:49:3: error: tlc build (sm_90a): --arch sm_90a runs one warp group" in out.err
    assert out.out == f"{DECODE}: ok for sm_90; sm_90a refuses it (above)\n"


def test_a_second_store_of_one_tensor_is_refused_at_its_line(tmp_path, capsys) -> None:
    path = tmp_path / "two.tl"
    path.write_text(MHA_TEXT + "Copy O (BM, HeadDim) in coordinate [L = block_idx] from register to global\n")
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:49:1: error: " in err
    assert "without a prior" not in err and "kernel IR:" not in err


def test_the_build_refuses_a_second_store_at_its_line_not_in_the_emitter() -> None:
    from tlc.api import compile_graph
    from tlc.builder import refuse_second_stores

    text = MHA_TEXT + "Copy O (BM, HeadDim) in coordinate [L = block_idx] from register to global\n"
    graph, _ = compile_graph(text, "two.tl", pipeline="verify,infer-shapes,resolve-transpose,insert-reshape,"
                             "online-softmax,verify-final")
    with pytest.raises(TlcError) as info:
        refuse_second_stores(graph)
    assert info.value.render().startswith("two.tl:49:1: error: tlc build: 'O' is stored to global memory a "
                                          "second time (first at line 48)")


# ---------------------------------------------------------------------- no silent choices
def test_a_param_bound_twice_by_d_is_an_error_naming_both(capsys) -> None:
    assert main(["check", MHA, "-D", "HeadDim=64", "-D", "HeadDim=128"]) == 1
    assert "-D HeadDim=64 and -D HeadDim=128 both bind HeadDim" in _one_line(capsys.readouterr().err)


def test_print_after_an_unknown_pass_is_an_error_listing_the_passes(capsys) -> None:
    assert main(["show", MHA, "--print-after", "insert-reshap"]) == 1
    err = _one_line(capsys.readouterr().err)
    assert "--print-after insert-reshap: no such pass" in err and "insert-reshape" in err and "lower-tile-ops" in err


def test_interp_sizes_with_more_numbers_than_inputs_is_an_error(capsys) -> None:
    assert main(["interp", MHA, "--sizes", "3x5x7"]) == 1
    assert "--sizes 3x5x7: 3 number(s), but the program has 2 int Input(s) (seqlen_q, seqlen_k)" in \
        _one_line(capsys.readouterr().err)


def test_a_schedule_knob_that_cannot_apply_is_a_warning_naming_it(tmp_path, capsys) -> None:
    assert main(["check", MHA, "-D", "L2Sections=true"]) == 0
    err = capsys.readouterr().err
    assert (f"sm_90: {MHA}: warning: L2Sections = true has no effect on this sm_90 kernel: not "
            "warp-specialised") in err
    assert f"sm_90a: {MHA}: warning: L2Sections = true has no effect on this sm_90a kernel: no causal mask" in err
    path = _with_param(tmp_path, "Param Persistent = false")  # off: honoured, nothing to say
    assert main(["check", path]) == 0 and "Persistent" not in capsys.readouterr().err


def test_a_default_schedule_knob_is_never_reported() -> None:
    from tlc.builder import lower_to_kernel_ir

    _, remarks = lower_to_kernel_ir(Path(MHA).read_bytes(), MHA, "sm_90", {}, name="mha_fwd")
    assert not [d for d in remarks if "has no effect" in d.message]


@pytest.mark.slow
def test_build_prints_the_warning_on_stderr(tmp_path, capsys, monkeypatch) -> None:
    monkeypatch.setenv("TLC_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["build", MHA, "-D", "L2Sections=true", "-o", str(tmp_path / "out")]) == 0
    out = capsys.readouterr()
    assert f"{MHA}: warning: L2Sections = true has no effect on this sm_90 kernel" in out.err
    assert "warning:" not in out.out and out.out.startswith(f"{MHA}: built mha_fwd for sm_90")
