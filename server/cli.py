"""`arbor-server` / `python -m server`: parse flags into ServerSettings and serve."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import uvicorn
from pydantic import ValidationError

from server.settings import REASONING_FORMATS, ServerSettings


def _json_object(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="arbor-server", description="Arbor's cache-optimized OpenAI-compatible server")
    a = p.add_argument
    a("--version", action="store_true", default=None, help="print the build (llama-cpp-python release, whether "
      "paged attention is compiled in, the backends and devices llama.cpp sees) and exit")
    a("--model", "-m", type=Path, help="GGUF model file (default: the embedded SmolLM2-135M-Instruct)")
    a("--host", help="address to bind (default 127.0.0.1)")
    a("--port", type=int, help="port (default 8080)")
    a("--parallel", "-np", type=int, help="slots: requests computed concurrently (default 4)")
    a("--ctx-size", "-c", type=int, help="total KV cells of the unified cache, shared by the slots (default 8192)")
    a("--batch-size", "-b", type=int, help="tokens per decode step (default 512)")
    a("--prefill-while-decoding", type=int, help="prompt tokens a step carries while other requests decode "
      "(default 0: the rest of --batch-size; docs/benchmarks.md, hostile requests, measures 128)")
    a("--threads", "-t", type=int, help="CPU threads (default: physical cores, as llama-server)")
    a("--alias", help="model name clients use (default: the file name)")
    a("--strict-model-name", action="store_true", default=None,
      help="404 for a request naming another model (default: serve the one model under any name)")
    a("--api-key", help="require 'Authorization: Bearer KEY' on every route but /health")
    a("--chat-template-file", type=Path, help="a Jinja chat template to use instead of the model's")
    a("--reasoning-format", choices=REASONING_FORMATS,
      help="how reasoning comes back: auto (default) / deepseek in message.reasoning_content, none in the content")
    a("--reasoning-budget", type=int, help="tokens a thinking model may reason before its end tag is forced "
      "(default -1: no limit; a request's reasoning_budget_tokens overrides)")
    a("--reasoning-budget-message", help="text written before the forced end tag (default none)")
    a("--chat-template-kwargs", type=_json_object, metavar="JSON",
      help='extra chat template variables for every request, e.g. \'{"enable_thinking": false}\'')
    a("--no-cache", action="store_true", default=None, help="disable every kind of prefix reuse")
    a("--max-queue", type=int, help="requests that may wait for a slot before 503 (default 64)")
    a("--n-gpu-layers", "-ngl", type=int, help="layers to offload to a GPU or NPU (default 0; -1: all); with no "
      "such device the server refuses to start, see --allow-cpu-fallback")
    a("--allow-cpu-fallback", action="store_true", default=None,
      help="with --n-gpu-layers and no GPU/NPU device, run on the CPU on purpose (a warning, /props says so) "
           "instead of refusing to start")
    a("--flash-attn", choices=["auto", "on", "off"])
    a("--paged-attn", nargs="?", const="on", choices=["auto", "on", "off"],
      help="paged attention over the unified KV: each sequence reads only the pages of cells it owns "
           "(default auto: on where the backend has the kernel; bare --paged-attn = on: refuse to start without it)")
    a("--page-size", type=int, help="KV cells per page of paged attention (default 16)")
    a("--cache-tiers", help="prefix sources to use, comma separated among A,S,H,D (default A,S,H)")
    a("--cache-ram", type=int, help="host tier budget in MiB (default 1024)")
    a("--cache-dir", type=Path, help="directory of the disk tier (adds D to the default tiers; "
                                         "with --cache-tiers, list D there)")
    a("--cache-disk", type=int, help="disk tier budget in MiB (default 4096)")
    a("--cache-disk-queue", type=int, help="MiB of KV waiting for the disk writer; a store beyond it is dropped "
                                           "and counted (default 64)")
    a("--cache-disk-reserve-mb", type=int, help="MiB the cache directory's filesystem keeps free: below it the disk "
      "tier evicts its own files, then declines writes, counted (default 1024; 0: none)")
    a("--cache-sessions", type=int, help="sessions whose lifecycle hints the cache remembers (default 4096)")
    a("--cache-session-idle", type=float, help="seconds after its last hint that a session is forgotten "
                                               "(default 3600)")
    a("--cache-max-pinned-sessions", type=int, help="sessions pinned at once; a new pin beyond it releases the "
      "oldest (default 64)")
    a("--cache-max-pinned-mb", type=int, help="MiB of host + disk KV pinned sessions may hold; beyond it the oldest "
      "pins are released (default 512)")
    a("--resident-cells", type=int, help="KV cells resident prefix owners may hold (default 2048)")
    a("--cache-route", choices=["cost", "longest"],
      help="cost (default): the plan with the lowest estimated time to first token; longest: the longest match")
    a("--cache-min-tokens", type=int, help="shortest prefix worth storing (default 32)")
    a("--cache-write-back-step", type=int, help="KiB of a parked slot's KV written back to host per engine step "
                                                "(default 4096; 0: write a slot back at once when it is reused)")
    a("--cache-shared", help="Redis/Valkey URL of a KV store shared by replicas of this model (tier R; needs "
                             "tier H), e.g. redis://127.0.0.1:6379/0 (default: off)")
    a("--cache-shared-chunk", type=int, help="tokens per chunk in the shared store (default 64, bench/shared_chunk.py)")
    a("--cache-shared-timeout-ms", type=float, help="timeout of the shared-store lookup at admission (default 50)")
    a("--cache-shared-queue", type=int, help="MiB of KV waiting for the shared-store writer (default 64)")
    a("--cache-shared-secret", help="the deployment secret shared by every replica (>= 16 bytes; values are MACed "
      "and keys derived with it; required with --cache-shared). Prefer --cache-shared-secret-file or "
      "ARBOR_SERVER_CACHE_SHARED_SECRET: a command line is visible to every local user")
    a("--cache-shared-secret-file", type=Path, help="a file holding the shared-store secret (e.g. a docker secret)")
    a("--cache-shared-max-value-mb", type=int, help="MiB: a longer shared-store value is refused from its length, "
      "never read (default 64)")
    a("--cache-idle-cells", type=int, help="KV cells idle slots may keep while other requests run; beyond it "
                                           "the least recently used one is written back and freed (default: no limit)")
    a("--allowed-hosts", help="names clients may reach the server by (the Host header; comma separated, "
      "'*.example.com' for subdomains), besides localhost, 127.0.0.1, ::1 and a specific --host; '*': any (behind "
      "a proxy that checks Host, or in compose where other containers call the server by its service name)")
    a("--cors-origins", help="origins browsers may call from, comma separated ('*': any; default: localhost only)")
    a("--embeddings", action="store_true", default=None, help="serve /v1/embeddings (a second, small context)")
    a("--pooling", choices=["model", "mean", "cls", "last"], help="embedding pooling (default: the model's)")
    a("--embeddings-ctx", type=int, help="most tokens of one embeddings input (default 512)")
    a("--log-level", choices=["debug", "info", "warning", "error"])
    events = p.add_argument_group("KV events", "the radix tree's changes as vLLM/SGLang-format ZMQ events, for "
                                  "KV-event routers (Dynamo, llm-d)")
    events.add_argument("--kv-events-endpoint", help="ZMQ endpoint to publish on: a bare port (5557) binds "
                        "loopback; tcp://*:5557 binds every interface (the events carry the token ids of every "
                        "cached prefix: anyone reaching the port reads them); tcp://host:port connects; "
                        "ipc://PATH binds (default: off)")
    events.add_argument("--kv-events-topic", help="ZMQ topic (default: empty)")
    events.add_argument("--kv-events-block-size", type=int, help="tokens per announced block (default 16)")
    limits = p.add_argument_group("request limits", "larger requests get a 4xx answer that names the flag")
    limits.add_argument("--max-body-kib", type=int, help="largest request body in KiB (default 4096; 413 beyond)")
    limits.add_argument("--max-json-depth", type=int, help="deepest nesting of a JSON body (default 64)")
    limits.add_argument("--max-messages", type=int, help="messages per chat request (default 1024)")
    limits.add_argument("--max-tools", type=int, help="tools per chat request (default 128)")
    limits.add_argument("--max-stop", type=int, help="stop strings per request (default 16)")
    limits.add_argument("--max-stop-chars", type=int, help="characters in one stop string (default 256)")
    limits.add_argument("--max-tools-kib", type=int, help="KiB of JSON of one request's tool definitions "
                        "(default 256)")
    limits.add_argument("--max-grammar-chars", type=int, help="characters of a request's grammar (default 65536)")
    limits.add_argument("--max-schema-kib", type=int, help="KiB of JSON of a request's response_format.json_schema "
                        "or json_schema (default 64)")
    limits.add_argument("--max-logit-bias", type=int, help="logit_bias entries per request (default 1024)")
    limits.add_argument("--max-embeddings-inputs", type=int, help="inputs of one embeddings request (default 256)")
    return p


def settings_from_args(argv: list[str] | None = None) -> ServerSettings:
    args = build_parser().parse_args(argv)
    given = {k: v for k, v in vars(args).items() if v is not None and k != "version"}
    return ServerSettings(**given)


def main(argv: list[str] | None = None) -> None:
    if build_parser().parse_args(argv).version:
        from server.build_info import version_text

        print(version_text())
        return
    try:
        settings = settings_from_args(argv)
    except ValidationError as exc:
        for err in exc.errors():
            where = "--" + "-".join(str(x) for x in err["loc"]).replace("_", "-") if err["loc"] else "settings"
            print(f"arbor-server: {where}: {err['msg']}", file=sys.stderr)
        sys.exit(2)
    if settings.paged_attn == "on":
        from server.engine import paged_attention

        if not paged_attention.compiled_in():
            print("arbor-server: --paged-attn on: this llama-cpp-python build has no paged attention (it was not "
                  "built from Arbor's patched source: run scripts/setup.sh)", file=sys.stderr)
            sys.exit(2)
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    _refuse_without_device(settings)
    from server.api.app import create_app

    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=settings.log_level,
                timeout_graceful_shutdown=5)


def _refuse_without_device(settings: ServerSettings) -> None:
    """Exit 2 before listening when layers are asked of an accelerator that is not there
    (llama.cpp would load everything on the CPU and say so only in a filtered INFO line)."""
    if settings.n_gpu_layers == 0:
        return
    from server.engine import backend_devices, offload

    try:
        warning = offload.check_devices(settings.n_gpu_layers, backend_devices.inventory(),
                                        settings.allow_cpu_fallback)
    except offload.NoAcceleratorError as exc:
        print(f"arbor-server: {exc}", file=sys.stderr)
        sys.exit(2)
    if warning:
        logging.getLogger("server.cli").warning("%s", warning)


if __name__ == "__main__":
    main()
