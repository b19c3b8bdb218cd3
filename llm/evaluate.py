"""`tlc gen --eval N`: N samples per variant against a live endpoint; the compile-and-correct rate.

Each sample is an ordinary single run (own seed, own `.tl` and transcript, replayable alone
with `--replay`), so an evaluation is just a loop plus a summary (printed, and `eval.json`).
Every file it would write is checked before the first call: none is replaced without --force,
and an existing transcript is kept (the new one gets a `-1` name).
"""
from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from tlc_llm.build import artifact_paths
from tlc_llm.client import ProviderError
from tlc_llm.output import OutputError, OutputExists, ensure_writable, write_output
from tlc_llm.redact import redact
from tlc_llm.request import VARIANTS, GenRequest, parse_request
from tlc_llm.run_tl import RunResult
from tlc_llm.session import Endpoint, RunSettings, live_session, transcript_path
from tlc_llm.targets import target_facts

Log = Callable[[str], None]


@dataclass
class Tally:
    variant: str
    built: bool = True  # False with --no-build: "compiled" then means "passes tlc check"
    samples: int = 0
    compiled: int = 0
    correct: int = 0
    unchecked: int = 0
    failures: list[str] = field(default_factory=list)

    def add(self, result: RunResult, messages: list[str]) -> None:
        """Compiled means built by tlc (or by NVRTC, vanilla); --no-build counts the check only."""
        if result.written and result.compiled is not False:
            self.compiled += 1
            if result.correct is True:
                self.correct += 1
            elif result.correct is None:
                self.unchecked += 1
        if not result.ok:
            self.failures.append(next((m for m in messages if m.startswith("error")), "failed"))

    def line(self) -> str:
        if not self.built:
            return f"{self.variant}: {self.compiled}/{self.samples} pass tlc check (not built: --no-build)"
        rate = f"{self.correct}/{self.samples} compile-and-correct"
        extra = f", {self.unchecked} compiled but not checked (no GPU)" if self.unchecked else ""
        return f"{self.variant}: {self.compiled}/{self.samples} compile, {rate}{extra}"


def eval_requests(settings: RunSettings) -> list[GenRequest]:
    """The request's variant, or every variant when the request says `all`."""
    request = parse_request(settings.request, settings.target)
    if not re.search(r"\ball\b", settings.request.lower()):
        return [request]
    out = []
    for variant in VARIANTS:
        text = re.sub(r"\ball(\s+variants?)?\b", variant, settings.request, flags=re.IGNORECASE)
        out.append(parse_request(text, settings.target))
    return out


def run_eval(args: argparse.Namespace, settings: RunSettings, endpoint: Endpoint, log: Log) -> int:
    from tlc_llm.run_tl import RunPlan, run_tl
    from tlc_llm.vanilla import run_vanilla

    out_dir: Path = args.transcript_dir or Path("tlc-gen-eval")
    requests = eval_requests(settings)
    suffix = ".vanilla.cu" if settings.mode == "vanilla" else ".tl"
    summary_path = out_dir / "eval.json"
    ensure_writable(summary_path, args.force)
    plans = []
    for request in requests:
        for i in range(settings.eval_samples):
            out_path = out_dir / f"{request.slug()}-s{i}{suffix}"
            ensure_writable(out_path, args.force)
            if settings.mode == "tl" and not args.no_build and not args.force:
                _refuse_existing(artifact_paths(out_dir, out_path.stem, settings.translate == "llm"))
            sample = replace(settings, request=request.describe(), seed=(settings.seed or 0) + i, eval_samples=0,
                             filename=out_path.name)
            build_dir = None if args.no_build else out_dir
            # the sample's request is re-read from its own text, exactly as `--replay` will read it
            sample_request = parse_request(sample.request, settings.target)
            plans.append(RunPlan(sample, sample_request, target_facts(settings.target), out_path, build_dir, args.force))
    tallies = {r.variant: Tally(r.variant, built=not args.no_build) for r in requests}
    calls = 0
    for plan in plans:
        tally = tallies[plan.request.variant]
        tally.samples += 1
        session = live_session(plan.settings, endpoint, args.backoff)
        messages: list[str] = []
        try:
            runner = run_vanilla if plan.settings.mode == "vanilla" else run_tl
            result = runner(session, plan, messages.append)
        except (ProviderError, OutputError) as exc:
            session.transcript.outcome.update(status="failed", message=str(exc))
            messages.append(f"error: {exc}")
            result = RunResult(False)
        finally:
            session.write_transcript(transcript_path(out_dir, plan.out_path.name))  # never replaces one
            calls += session.client.calls
        tally.add(result, messages)
        status = "ok" if result.ok else "failed"
        log(f"{plan.out_path.name}: {status}" + (f" ({messages[-1]})" if messages else ""))
    for tally in tallies.values():
        log(tally.line())
    summary = {"settings": settings.to_json(), "model": endpoint.model, "llm_calls": calls,
               "variants": {t.variant: {k: v for k, v in vars(t).items() if k != "variant"} for t in tallies.values()}}
    text = json.dumps(summary, indent=2, sort_keys=True) + "\n"
    write_output(summary_path, redact(text, endpoint.api_key), args.force)
    log(f"{calls} LLM call(s); summary in {summary_path}")
    return 0


def _refuse_existing(paths: list[Path]) -> None:
    clash = next((path for path in paths if path.exists()), None)
    if clash is not None:
        raise OutputExists(f"{clash} already exists (tlc build would replace it); pass --force or --no-build")
