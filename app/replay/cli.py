"""``arbor replay``: replay manifests, generate workloads, import AIPerf inputs, compare runs.

Forms::

    arbor replay MANIFEST --base-url URL [--concurrency N | --schedule] [--out results.json] ...
    arbor replay generate {shared-prefix,agent-sessions,branch-fanout,unique} --out MANIFEST [--api API] [options]
    arbor replay convert MANIFEST --api {chat,responses,messages} --out MANIFEST
    arbor replay record --upstream URL --out MANIFEST [--host H] [--port P]
    arbor replay import-aiperf INPUTS_JSON --out MANIFEST [--session-interval S]
    arbor replay compare A.json B.json ... [--out-dir DIR]

A manifest line names its API (chat completions, responses, messages; none: chat) and the
replay sends it there; ``generate --api`` and ``convert`` turn chat lines into the same
requests through another API.

The workbench CLI calls :func:`register`; ``python -m app.replay`` runs :func:`main` alone.
Exit status: 0 on success (a replay with some failed requests still succeeds; they are in
the results), 1 when every request of a replay failed, 2 on bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from harness.manifest import API_PATHS, CHAT, ManifestError, read_manifest, write_manifest

ACTIONS = ("generate", "convert", "record", "import-aiperf", "compare")
FORMS = __doc__.split("Forms::")[1].split("\n\n")[1]


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``replay`` to the ``arbor`` command's sub-commands (sets ``func``)."""
    parser = subparsers.add_parser(
        "replay", help="replay request manifests against a server; generate workloads; compare runs",
        description=FORMS + "\n\nRun `arbor replay ACTION --help` for an action's options.",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("target", metavar="MANIFEST|ACTION",
                        help=f"a manifest to replay, or one of: {', '.join(ACTIONS)}")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    parser.set_defaults(func=_dispatch)


def _dispatch(args: argparse.Namespace) -> int:
    handlers = {"generate": _generate, "convert": _convert, "record": _record, "import-aiperf": _import_aiperf,
                "compare": _compare}
    handler = handlers.get(args.target)
    try:
        if handler is not None:
            return handler(args.rest)
        return _run([args.target, *args.rest])
    except (ValueError, ManifestError, OSError) as exc:
        print(f"arbor replay: error: {exc}", file=sys.stderr)
        return 2


# -- run -----------------------------------------------------------------------------------

def run_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="arbor replay", description="Replay MANIFEST against an "
                                     "OpenAI-compatible server (each line to its API: chat completions, responses "
                                     "or messages) and record TTFT, latency, tokens and cache use.")
    parser.add_argument("manifest", type=Path, metavar="MANIFEST")
    parser.add_argument("--base-url", required=True, help="server URL, e.g. http://127.0.0.1:8080 (or .../v1)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=int, default=1, help="requests in flight at once (default 1)")
    mode.add_argument("--schedule", action="store_true", help="start each request at its line's t")
    parser.add_argument("--out", type=Path, help="results JSON (default: MANIFEST_STEM.results.json)")
    parser.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"),
                        help="bearer token (default: $OPENAI_API_KEY)")
    parser.add_argument("--model", help="send this model name in every request")
    parser.add_argument("--label", help="name of this run in comparisons (default: the results file name)")
    parser.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    parser.add_argument("--force-output-length", action="store_true",
                        help="ask for exactly expected_output_tokens (max_tokens + ignore_eos)")
    parser.add_argument("--no-session-hints", action="store_true",
                        help="send no cache hints (X-Arbor-Session / X-Arbor-Cache-State headers; "
                             "recorded body hints are never sent)")
    parser.add_argument("--ideal", choices=("auto", "server", "words", "off"), default="auto",
                        help="how to compute the ideal: the server's tokens (/apply-template + /tokenize), "
                             "word pieces, or not at all; auto tries the server first")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


def _run(argv: Sequence[str]) -> int:
    from harness.serving.runner import ReplaySettings, replay  # httpx/tqdm only when replaying

    args = run_parser().parse_args(argv)
    lines = read_manifest(args.manifest)
    if not lines:
        raise ValueError(f"{args.manifest}: the manifest has no requests")
    settings = ReplaySettings(
        base_url=args.base_url, concurrency=args.concurrency, schedule=args.schedule, api_key=args.api_key,
        model=args.model, timeout_s=args.timeout, force_output_length=args.force_output_length,
        session_hints=not args.no_session_hints, ideal=args.ideal, progress=not args.no_progress,
        label=args.label)
    result = asyncio.run(replay(lines, settings))
    result.metadata["manifest"] = str(args.manifest)
    out = args.out or Path(f"{args.manifest.stem}.results.json")
    result.save(out)
    print(format_summary(result.summary))
    print(f"results: {out}")
    return 1 if result.summary["ok"] == 0 else 0


def _fmt(value: float | None, unit: str = "s") -> str:
    return "-" if value is None else f"{value:.3f}{unit}"


def format_summary(summary: dict) -> str:
    """A few readable lines for the terminal."""
    ttft, lat, tok, thr = summary["ttft_s"], summary["latency_s"], summary["tokens"], summary["throughput"]
    lines = [
        f"requests {summary['requests']}  ok {summary['ok']}  errors {summary['errors']}  "
        f"wall {summary['wall_s']:.2f}s",
        f"TTFT     p50 {_fmt(ttft['p50'])}  p95 {_fmt(ttft['p95'])}  mean {_fmt(ttft['mean'])}",
        f"latency  p50 {_fmt(lat['p50'])}  p95 {_fmt(lat['p95'])}  mean {_fmt(lat['mean'])}",
        f"throughput {_fmt(thr['requests_per_s'], ' req/s')}  {_fmt(thr['output_tokens_per_s'], ' out tok/s')}",
        f"prompt tokens {tok['prompt']}  cached {tok['cached']}  computed {tok['computed']}",
    ]
    ideal = summary.get("ideal")
    if ideal:
        if "computed_over_ideal" in ideal:
            value = ideal["computed_over_ideal"]
            lines.append(f"ideal computed {ideal['ideal_computed_tokens']} tokens  computed/ideal "
                         f"{'-' if value is None else f'{value:.2f}'}")
        else:
            value = ideal.get("computed_over_ideal_estimate")
            lines.append(f"ideal fraction {ideal['ideal_fraction']:.3f} (words)  computed/ideal estimate "
                         f"{'-' if value is None else f'{value:.2f}'}")
    if summary.get("cache_sources"):
        lines.append("cache sources " + "  ".join(f"{k}:{v}" for k, v in sorted(summary["cache_sources"].items())))
    return "\n".join(lines)


# -- generate ------------------------------------------------------------------------------

def generate_parser() -> argparse.ArgumentParser:
    from app.replay.workloads import GENERATORS
    from harness.workloads.generators import ORDERS, SCENARIOS

    parser = argparse.ArgumentParser(prog="arbor replay generate",
                                     description="Write a synthetic workload manifest and print its ideal.")
    kinds = parser.add_subparsers(dest="kind", required=True, metavar="KIND")
    choices = {"scenario": tuple(SCENARIOS), "order": ORDERS}
    for kind, function in GENERATORS.items():
        sub = kinds.add_parser(kind, help=(function.__doc__ or "").strip().splitlines()[0],
                               description=function.__doc__)
        sub.add_argument("--out", type=Path, required=True, help="manifest file to write (JSONL)")
        sub.add_argument("--api", choices=tuple(API_PATHS), default=CHAT,
                         help="the API the requests are written for (default: chat)")
        # Options mirror the generator's keyword arguments, so they cannot drift apart.
        for name, param in inspect.signature(function).parameters.items():
            if name == "tokenize":
                continue
            kind_of = str if param.default is None else type(param.default)
            sub.add_argument(f"--{name.replace('_', '-')}", dest=name, type=kind_of, default=param.default,
                             choices=choices.get(name), help=f"default: {param.default}")
    return parser


def _generate(argv: Sequence[str]) -> int:
    from app.replay.workloads import GENERATORS
    from harness.workloads.api_shapes import lines_as

    args = vars(generate_parser().parse_args(argv))
    kind, out, api = args.pop("kind"), args.pop("out"), args.pop("api")
    workload = GENERATORS[kind](**args)
    write_manifest(lines_as(workload.lines, api), out)
    print(json.dumps(workload.describe(), indent=2))
    print(f"manifest: {out}")
    return 0


# -- convert -------------------------------------------------------------------------------

def _convert(argv: Sequence[str]) -> int:
    from harness.workloads.api_shapes import lines_as

    parser = argparse.ArgumentParser(prog="arbor replay convert",
                                     description="Write a chat manifest's requests as the same requests through "
                                                 "another API (same messages, tools, output length).")
    parser.add_argument("manifest", type=Path, metavar="MANIFEST")
    parser.add_argument("--api", choices=tuple(API_PATHS), required=True, help="the API to write the lines for")
    parser.add_argument("--out", type=Path, required=True, help="manifest file to write (JSONL)")
    args = parser.parse_args(argv)
    lines = lines_as(read_manifest(args.manifest), args.api)
    write_manifest(lines, args.out)
    print(f"{len(lines)} requests for {API_PATHS[args.api]} -> {args.out}")
    return 0


# -- record --------------------------------------------------------------------------------

def _record(argv: Sequence[str]) -> int:
    from app.replay.record import __doc__ as doc
    from app.replay.record import serve

    parser = argparse.ArgumentParser(prog="arbor replay record", description=(doc or "").split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--upstream", required=True, help="the server requests go to, e.g. http://127.0.0.1:8080")
    parser.add_argument("--out", type=Path, required=True, help="manifest file to write (JSONL)")
    parser.add_argument("--host", default="127.0.0.1", help="address the proxy listens on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=8089, help="port the proxy listens on (default 8089)")
    args = parser.parse_args(argv)
    serve(args.upstream, args.out, args.host, args.port)
    return 0


# -- import-aiperf -------------------------------------------------------------------------

def _import_aiperf(argv: Sequence[str]) -> int:
    from harness.workloads.manifest_import import import_aiperf_inputs

    parser = argparse.ArgumentParser(prog="arbor replay import-aiperf",
                                     description="Convert an AIPerf inputs.json file into a manifest.")
    parser.add_argument("inputs", type=Path, metavar="INPUTS_JSON")
    parser.add_argument("--out", type=Path, required=True, help="manifest file to write (JSONL)")
    parser.add_argument("--session-interval", type=float, default=0.0,
                        help="seconds between session starts (t of session i = i * interval)")
    args = parser.parse_args(argv)
    lines = import_aiperf_inputs(args.inputs, args.session_interval)
    write_manifest(lines, args.out)
    print(f"{len(lines)} requests in {len({line.session_id for line in lines})} sessions -> {args.out}")
    return 0


# -- compare -------------------------------------------------------------------------------

def _compare(argv: Sequence[str]) -> int:
    from harness.reports.compare import compare

    parser = argparse.ArgumentParser(prog="arbor replay compare",
                                     description="Ratios of each run against the first, and plots (PNG + SVG).")
    parser.add_argument("results", type=Path, nargs="+", metavar="RESULTS_JSON")
    parser.add_argument("--out-dir", type=Path, default=Path("replay-compare"), help="where plots go")
    args = parser.parse_args(argv)
    comparison = compare(args.results, args.out_dir)
    print(comparison.table())
    for path in comparison.plots:
        print(f"plot: {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry: ``python -m app.replay ...`` behaves like ``arbor replay ...``."""
    parser = argparse.ArgumentParser(prog="arbor")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["replay", *(sys.argv[1:] if argv is None else argv)])
    return args.func(args)
