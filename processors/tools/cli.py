"""The `agui-stream` command."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="agui-stream",
        description="Validate AG-UI 1.1 run streams and reassemble their history.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    check = commands.add_parser(
        "check",
        help="check one run key's events offline (a JSON-lines file, or - for stdin)",
        description="Check the events of one run key (one JSON event per line, in order) "
        "against the AG-UI 1.1 rules. Exit 0 when no run failed, 1 when one did, "
        "2 for usage or I/O errors.",
    )
    check.add_argument("path", help="JSON-lines file of one run key's record values, or -")
    check.add_argument("--json", action="store_true",
                       help="print one JSON object in the conformance corpus's format")
    commands.add_parser(
        "worker",
        help="run one stream-processing worker (configured by environment variables)",
    )
    commands.add_parser(
        "create-topics",
        help="create the raw, history, dead-letter and internal topics, then exit",
    )
    commands.add_parser(
        "tap",
        help="proxy an AG-UI agent endpoint (HTTP + SSE) and publish its runs to the raw topic",
        description="Forward each request to AGUI_TAP_UPSTREAM_URL, stream the response back "
        "unchanged, and publish every event to the raw topic (docs/tap.md). Configured by "
        "environment variables; exit 2 for a bad one.",
    )
    demo = commands.add_parser(
        "demo",
        help="create topics, start a worker, replay the bundled sample runs, print a summary",
    )
    demo.add_argument("--replay-only", action="store_true",
                      help="only produce the sample runs to the input topic, then exit")
    hash_token = commands.add_parser(
        "hash-token",
        help="read a thread API token on stdin, print its line for AGUI_TOKENS_FILE",
        description="Read one bearer token from stdin (its first line) and print the line "
        "that gives it to TENANT in the tokens file. The token itself is not printed.",
    )
    hash_token.add_argument("tenant", help="the tenant the token authenticates")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "check":
        from processors.tools.checker import run_check

        return run_check(args.path, args.json)
    if args.command == "worker":
        from processors.runtime.worker import run_worker

        return run_worker()
    if args.command == "create-topics":
        from processors.runtime.worker import run_create_topics

        return run_create_topics()
    if args.command == "tap":
        from processors.runtime.tap_server import run_tap

        return run_tap()
    if args.command == "demo":
        from processors.tools.demo import run_demo

        return run_demo(args.replay_only)
    if args.command == "hash-token":
        return _hash_token(args.tenant)
    raise AssertionError(args.command)  # argparse rejects unknown commands


def _hash_token(tenant: str) -> int:
    from processors.view.tenant_tokens import token_line

    try:
        print(token_line(tenant, sys.stdin.readline().rstrip("\r\n")))
    except ValueError as error:
        print(f"agui-stream hash-token: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
