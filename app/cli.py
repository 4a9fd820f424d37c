"""`arbor`: the workbench command line (serve, verify, token, prune, replay)."""

from __future__ import annotations

import argparse
import sys

from app.replay.cli import register as register_replay


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from app.main import create_app
    from app.settings import WorkbenchSettings

    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    settings = WorkbenchSettings(**overrides)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=args.log_level)
    return 0


def _verify(args: argparse.Namespace) -> int:
    from app.auth.operator_token import existing_token
    from app.settings import WorkbenchSettings
    from app.verify import verify

    settings = WorkbenchSettings()
    configured = settings.workbench_token.get_secret_value() if settings.workbench_token else None
    token = existing_token(configured, settings.data_dir)
    return verify(args.base_url, chat=args.chat, timeout_s=args.timeout, keep=args.keep, token=token)


def _token(args: argparse.Namespace) -> int:
    """Print the URL that signs a browser into the workbench (generating the token if there is
    none yet), or with --rotate replace the stored token first."""
    from app.auth.operator_token import resolve_token, rotate_token
    from app.main import sign_in_url
    from app.settings import WorkbenchSettings

    settings = WorkbenchSettings()
    if settings.workbench_token:
        if args.rotate:
            print("arbor: ARBOR_WORKBENCH_TOKEN sets the token; change it there and restart", file=sys.stderr)
            return 2
        token = resolve_token(settings.workbench_token.get_secret_value(), settings.data_dir)
    else:
        token = rotate_token(settings.data_dir) if args.rotate else resolve_token(None, settings.data_dir)
    print(sign_in_url(settings, token))
    if args.rotate:
        print("arbor: restart the workbench for the new token to take effect", file=sys.stderr)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="arbor", description="Arbor agent workbench")
    subparsers = parser.add_subparsers(dest="command", required=True)

    serve = subparsers.add_parser("serve", help="run the workbench (settings from the environment)")
    serve.add_argument("--host", default=None, help="bind address (default ARBOR_HOST or 127.0.0.1)")
    serve.add_argument("--port", type=int, default=None, help="port (default ARBOR_PORT or 8090)")
    serve.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    serve.set_defaults(func=_serve)

    prune = subparsers.add_parser("prune", help="delete now what the retention settings no longer keep "
                                                "(ARBOR_RETAIN_*_DAYS; a running workbench also does it periodically)")
    for name, what in (("traces", "trace span bodies"), ("turn-events", "turn events"),
                       ("checkpoints", "checkpoints inside turns")):
        prune.add_argument(f"--{name}-days", type=float, default=None, metavar="DAYS",
                           help=f"keep {what} this many days after their turn ended instead of the setting's "
                                "(0 = forever)")
    prune.set_defaults(func=_prune)

    verify = subparsers.add_parser("verify", help="check a running workbench end to end")
    verify.add_argument("--base-url", default="http://127.0.0.1:8090", help="the workbench URL")
    verify.add_argument("--chat", action="store_true",
                        help="also run one real turn per scenario (first step forced to a tool)")
    verify.add_argument("--timeout", type=float, default=600.0, help="seconds per HTTP request (default 600)")
    verify.add_argument("--keep", action="store_true", help="keep the sessions verify creates")
    verify.set_defaults(func=_verify)

    token = subparsers.add_parser("token", help="print the URL that signs a browser in (ARBOR_DATA_DIR's token)")
    token.add_argument("--rotate", action="store_true", help="replace the stored token (restart the workbench after)")
    token.set_defaults(func=_token)

    register_replay(subparsers)  # `arbor replay` lives in app/replay/cli.py
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result = args.func(args)
    return int(result or 0)


def _prune(args: argparse.Namespace) -> int:
    """Prune once with the settings' retention (or the days given), print what went."""
    from dataclasses import replace

    from app.db.engine import make_engine
    from app.services.retention import RetentionPolicy, prune
    from app.settings import WorkbenchSettings

    settings = WorkbenchSettings()
    policy = RetentionPolicy.of(settings)
    overrides = {field: value for field, value in (("traces_days", args.traces_days),
                                                  ("turn_events_days", args.turn_events_days),
                                                  ("checkpoints_days", args.checkpoints_days)) if value is not None}
    if any(value < 0 for value in overrides.values()):
        print("arbor prune: days must be 0 (keep forever) or more", file=sys.stderr)
        return 2
    policy = replace(policy, **overrides)
    engine = make_engine(settings.database_url)
    try:
        report = prune(engine, settings, policy)
    finally:
        engine.dispose()
    print(f"arbor prune: {report.summary(policy)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
