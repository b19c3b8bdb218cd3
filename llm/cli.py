"""`tlc gen`: argument parsing and the top-level error policy (one line, no traceback).

Reached from `tlc` through the `tlc.commands` entry point `gen = tlc_llm.cli:main`.
Exit status: 0 done, 1 the run failed (message says why), 2 bad usage.
"""
from __future__ import annotations

import argparse
import math
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Callable, NoReturn

from tlc_llm.build import artifact_paths
from tlc_llm.checker import ToolchainError
from tlc_llm.client import ProviderError
from tlc_llm.output import OutputError, ensure_writable, plain_name_problem
from tlc_llm.request import RequestError, parse_request, unhonoured
from tlc_llm.redact import redact
from tlc_llm.session import (
    DEFAULT_TIMEOUT_S, DEFAULT_TOTAL_TIMEOUT_S, Endpoint, RunSettings, Session, SetupError, live_session,
    replay_session, transcript_path,
)
from tlc_llm.targets import TargetError, target_facts
from tlc_llm.terminal import escape_controls
from tlc_llm.transcript import TranscriptError, load, unique_path

DEFAULT_TARGET = "sm_90"
MAX_SECONDS = 86400.0  # a day: past that a timeout is a typo (and `inf` overflows the platform's timers)
MAX_EVAL_SAMPLES = 1000  # per variant; each sample costs at least two model calls
Log = Callable[[str], None]
_FAILURES = (ProviderError, ToolchainError, OutputError, RequestError, SetupError, TargetError, TranscriptError)


class UsageError(SetupError):
    """The command line does not parse (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (through `main`'s log, so its control bytes are escaped)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see tlc gen --help)")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tlc gen", description=(
        "Ask an LLM for LLM-TL (sketch, then parameters), check and repair it with tlc, write and build it."))
    p.add_argument("request", nargs="?", help='what to generate, e.g. "GQA, causal, head dim 128, bf16"')
    p.add_argument("--target", help=f"GPU target, e.g. sm_80, sm_90, sm_90a (default {DEFAULT_TARGET})")
    p.add_argument("-o", "--output", type=Path, help="output file (default: <variant>_<...>.tl in the current directory)")
    p.add_argument("--force", action="store_true", help="overwrite existing output files")
    p.add_argument("--translate", choices=("tlc", "llm"), help="who writes the CuTe: tlc's emitter (default) or the LLM")
    p.add_argument("--vanilla", action="store_true", help="baseline: ask for CUDA directly, report compile/correct")
    p.add_argument("--eval", type=int, metavar="N", help="N samples per variant; report the compile-and-correct rate")
    p.add_argument("--replay", type=Path, metavar="TRANSCRIPT", help="rerun a recorded run offline")
    p.add_argument("--transcript-dir", type=Path, help="where transcripts go (default: beside the output)")
    p.add_argument("--max-rounds", type=int, help="repair rounds per stage after the first answer (default 3)")
    p.add_argument("--no-build", action="store_true", help="write and check the .tl, do not build it")
    p.add_argument("--build-dir", type=Path, help="where tlc build writes .cu/.cubin/.json (default: beside the .tl)")
    p.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE", help="parameter for the build")
    p.add_argument("--base-url", help="OpenAI-compatible endpoint, e.g. https://api.deepseek.com/v1 (or $TLC_LLM_BASE_URL)")
    p.add_argument("--model", help="model name (or $TLC_LLM_MODEL)")
    p.add_argument("--api-key", help="API key; prefer $TLC_LLM_API_KEY (a flag shows up in `ps`)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S", help=(
        f"seconds for one HTTP request, connect to last byte of the reply (default {DEFAULT_TIMEOUT_S:g})"))
    p.add_argument("--total-timeout", type=float, metavar="S", help=(
        f"seconds for one model call, all retries and backoff included (default {DEFAULT_TOTAL_TIMEOUT_S:g}, "
        "or --timeout if larger): the most a dead endpoint costs"))
    p.add_argument("--retries", type=int, help="retries on 429/5xx/timeouts/malformed replies (default 3)")
    p.add_argument("--backoff", type=float, default=1.0, help="first retry delay in seconds, doubled each time")
    p.add_argument("--temperature", type=float, help="sampling temperature (default 0.2)")
    p.add_argument("--seed", type=int, help="sampling seed, for endpoints that honour it")
    p.add_argument("--max-tokens", type=int, help="cap on tokens per answer")
    return p


def _defines(items: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise SetupError(f"-D expects NAME=VALUE, got '{item}'")
        if name.strip() in out:
            raise SetupError(f"-D {name.strip()} is given twice ({out[name.strip()]} and {value.strip()}); keep one")
        out[name.strip()] = value.strip()
    return out


def _check_numbers(args: argparse.Namespace) -> None:
    """Flags whose values would otherwise fail deep inside the run (a timer, a sleep, the JSON sent)."""
    for name, value in (("--max-rounds", args.max_rounds), ("--retries", args.retries)):
        if value is not None and value < 0:
            raise SetupError(f"{name} must be >= 0")
    for name, seconds in (("--timeout", args.timeout), ("--total-timeout", args.total_timeout)):
        if seconds is not None and not 0 < seconds <= MAX_SECONDS:
            raise SetupError(f"{name} must be > 0 and at most {MAX_SECONDS:g} seconds")
    if not (math.isfinite(args.backoff) and args.backoff >= 0):
        raise SetupError("--backoff must be a number of seconds >= 0")
    if args.temperature is not None and not (math.isfinite(args.temperature) and args.temperature >= 0):
        raise SetupError("--temperature must be a number >= 0")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise SetupError("--max-tokens must be >= 1")
    if args.eval is not None and not 1 <= args.eval <= MAX_EVAL_SAMPLES:
        raise SetupError(f"--eval N needs 1 <= N <= {MAX_EVAL_SAMPLES} samples per variant")


def _settings(args: argparse.Namespace) -> RunSettings:
    if args.request is None:
        raise SetupError('missing request, e.g. tlc gen "GQA, causal, head dim 128, bf16" --target sm_90')
    request = parse_request(args.request, args.target)
    _check_numbers(args)
    if args.vanilla and args.translate == "llm":
        raise SetupError("--vanilla asks for CUDA directly; --translate llm applies to the TL workflow only")
    if args.eval is not None and args.output is not None:
        raise SetupError("--eval writes one file per sample into --transcript-dir (default tlc-gen-eval); drop -o")
    return RunSettings(
        request=args.request, target=request.target or DEFAULT_TARGET,
        mode="vanilla" if args.vanilla else "tl", translate=args.translate or "tlc",
        max_rounds=3 if args.max_rounds is None else args.max_rounds,
        temperature=0.2 if args.temperature is None else args.temperature, seed=args.seed,
        max_tokens=args.max_tokens, max_retries=3 if args.retries is None else args.retries,
        defines=_defines(args.defines), eval_samples=args.eval or 0,
    )


_REPLAYED = ("request", "target", "translate", "max_rounds", "temperature", "seed", "max_tokens", "retries", "eval")


def _replay_conflicts(args: argparse.Namespace) -> list[str]:
    named = [name for name in _REPLAYED if getattr(args, name, None) is not None]
    return named + (["vanilla"] if args.vanilla else []) + (["-D"] if args.defines else [])


def _default_output(settings: RunSettings, transcript: Path | None) -> Path:
    """For a replay the recorded name, if it is a plain file name (the transcript may have been
    edited to say `../../x.tl`); else one that names the specialization."""
    if settings.filename:
        problem = plain_name_problem(settings.filename)
        if problem:
            raise SetupError(f"transcript {transcript} records the output name '{settings.filename}', which is not "
                             f"a plain file name ({problem}); pass -o PATH to choose where the replay writes")
        return Path(settings.filename)
    request = parse_request(settings.request, settings.target)
    suffix = ".vanilla.cu" if settings.mode == "vanilla" else ".tl"
    return Path(request.slug() + suffix)


def _run_single(args: argparse.Namespace, settings: RunSettings, session: Session, out_path: Path, log: Log) -> bool:
    """Run one generation; True when it fully succeeded."""
    from tlc_llm.run_tl import RunPlan, run_tl

    request = parse_request(settings.request, settings.target)
    facts = target_facts(settings.target)
    build_dir = None if args.no_build else (args.build_dir or out_path.parent)
    plan = RunPlan(settings, request, facts, out_path, build_dir, args.force)
    if settings.mode == "vanilla":
        from tlc_llm.vanilla import run_vanilla

        return run_vanilla(session, plan, log).ok
    return run_tl(session, plan, log).ok


def _preflight(args: argparse.Namespace, settings: RunSettings) -> Path:
    """Everything that can fail before spending a model call: target, output, artifacts, transcript folder."""
    target_facts(settings.target)
    out_path = args.output or _default_output(settings, args.replay)
    ensure_writable(out_path, args.force)
    if settings.mode == "tl" and not args.no_build:
        build_dir = args.build_dir or out_path.parent
        artifacts = artifact_paths(build_dir, out_path.stem, settings.translate == "llm")
        if out_path in artifacts:
            raise SetupError(f"-o {out_path} is a name the build writes its own output to; name the TL file "
                             f"{out_path.stem}.tl, or pass --no-build")
        clash = [path for path in artifacts if path.exists()]
        if clash and not args.force:
            raise OutputError(f"{clash[0]} already exists (tlc build would replace it); pass --force or --no-build")
    folder = args.transcript_dir or out_path.parent
    if folder.exists() and not folder.is_dir():
        raise SetupError(f"--transcript-dir {folder} is not a directory")
    return out_path


def _endpoint(args: argparse.Namespace) -> Endpoint:
    total = args.total_timeout or max(DEFAULT_TOTAL_TIMEOUT_S, args.timeout)
    return Endpoint.resolve(args.base_url, args.model, args.api_key, args.timeout, total)


def _warn_unhonoured(settings: RunSettings, log: Log) -> None:
    """Before any model call, one line per feature the request asks for that tlc gen cannot write (a
    window, ALiBi, dropout, …), and then what it will write: a request is never silently narrowed."""
    request = parse_request(settings.request, settings.target)
    dropped = unhonoured(request)
    for line in dropped:
        log(f"warning: {line}")
    if dropped and not settings.eval_samples:  # an eval's request may stand for every variant
        log(f"note: what tlc gen writes: {request.describe()}")


def run(argv: list[str], log: Log, on_secret: Callable[[str | None], None] = lambda _key: None) -> int:
    """`on_secret` learns the API key as soon as it is known, so the caller can keep it out of every line."""
    args = _parser().parse_args(argv)
    if args.replay is not None:
        conflicts = _replay_conflicts(args)
        if conflicts:
            raise SetupError(f"--replay takes the request and options from the transcript; drop {', '.join(conflicts)}")
        settings, session = replay_session(load(args.replay))
        if settings.eval_samples:
            raise SetupError("an --eval run is replayed one sample at a time: pass one sample's transcript")
        _warn_unhonoured(settings, log)
    else:
        settings = _settings(args)
        _warn_unhonoured(settings, log)
        if settings.eval_samples:
            from tlc_llm.evaluate import run_eval

            endpoint = _endpoint(args)
            on_secret(endpoint.api_key)
            return run_eval(args, settings, endpoint, log)
        endpoint = _endpoint(args)
        on_secret(endpoint.api_key)
        session = live_session(settings, endpoint, args.backoff)
    out_path = _preflight(args, settings)
    if args.replay is None:
        settings = replace(settings, filename=out_path.name)
        session.transcript.command = settings.to_json()
    elif settings.translate == "llm" and settings.filename and Path(settings.filename).stem != out_path.stem:
        raise SetupError(f"this run used --translate llm, whose kernel symbol derives from the file name: "
                         f"replay it with -o {Path(settings.filename).name}")
    directory = args.transcript_dir or out_path.parent
    record = unique_path(transcript_path(directory, out_path.name))
    try:
        ok = _run_single(args, settings, session, out_path, log)
        session.finish_replay()
    except Exception as exc:  # the transcript says how the run ended, whatever ended it
        session.transcript.outcome.setdefault("status", "failed")
        session.transcript.outcome.setdefault("message", str(exc))
        raise
    finally:
        log(f"transcript: {session.write_transcript(record)}")
    return 0 if ok else 1


def main(argv: list[str] | None = None) -> int:
    """Entry point for `tlc gen`; every expected failure is one `tlc gen: error:` line."""
    secrets: list[str] = []

    def log(message: str) -> None:
        for secret in secrets:  # what is shown is redacted where it is built; this is the last line of defence
            message = redact(message, secret)
        if message.startswith("error: "):
            message = " ".join(message.split())  # an error is one line, whatever it quotes
        print(f"tlc gen: {escape_controls(message)}", file=sys.stderr)

    def keep_secret(key: str | None) -> None:
        if key:
            secrets.append(key)

    try:
        return run(list(sys.argv[1:] if argv is None else argv), log, keep_secret)
    except UsageError as exc:
        log(f"error: {exc}")
        return 2
    except _FAILURES as exc:
        log(f"error: {exc}")
        return 1
    except KeyboardInterrupt:
        log("error: interrupted")
        return 130
    except SystemExit as exc:  # argparse after --help
        return int(exc.code) if isinstance(exc.code, int) else 2
    except Exception as exc:  # noqa: BLE001 - the promise is one line, never a traceback
        if os.environ.get("TLC_DEBUG"):
            raise
        log(f"error: internal error ({type(exc).__name__}: {exc}); rerun with TLC_DEBUG=1 for a traceback")
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
