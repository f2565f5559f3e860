"""The `agui-stream` command."""

from __future__ import annotations

import argparse
import sys

from topics.acls import AGENT_SERVER, HISTORY_SERVICE, HISTORY_SERVICE_GROUP, WORKER


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
    create = commands.add_parser(
        "create-topics",
        help="create the raw, history, dead-letter and internal topics, then exit",
        description="Create the service's topics that do not exist. With --tenant (per-tenant"
        " layout, AGUI_HISTORY_TOPIC_TEMPLATE): only those tenants' history and dead-letter"
        " topics, which the workers never create themselves.",
    )
    create.add_argument("--tenant", action="append", metavar="TENANT",
                        help="a tenant whose own topics to create (repeatable)")
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
    demo.add_argument("--worker-env", metavar="FILE",
                      help="KEY=VALUE lines (`export` allowed, shell-quoted) set for the"
                      " worker only: its own credentials (deploy/demo.sh --secure)")
    hash_token = commands.add_parser(
        "hash-token",
        help="read a thread API token on stdin, print its line for AGUI_TOKENS_FILE",
        description="Read one bearer token from stdin (its first line) and print the line "
        "that gives it to TENANT in the tokens file. The token itself is not printed.",
    )
    hash_token.add_argument("tenant", help="the tenant the token authenticates")
    acls = commands.add_parser(
        "acls",
        help="print the Kafka ACLs of a deployment (kafka-acls.sh commands) for the settings",
        description="Print the least-privilege ACLs of the workers, the history service and "
        "the agent servers for the topic names of the current settings (environment), as "
        "kafka-acls.sh commands, or as the Markdown of docs/operations.md. A worker checks "
        "its own at start.",
    )
    acls.add_argument("--worker", default=WORKER, help=f"workers' principal ({WORKER})")
    acls.add_argument("--history-service", default=HISTORY_SERVICE,
                      help=f"history service's principal ({HISTORY_SERVICE})")
    acls.add_argument("--history-group", default=HISTORY_SERVICE_GROUP,
                      help=f"history service's consumer group ({HISTORY_SERVICE_GROUP})")
    acls.add_argument("--agent-server", default=AGENT_SERVER,
                      help=f"agent servers' principal ({AGENT_SERVER})")
    acls.add_argument("--tenant", action="append", default=[], metavar="TENANT",
                      help="per-tenant layout: also the ACLs of this tenant's own history"
                      f" service ({HISTORY_SERVICE}-<tenant>), which reads its own topic"
                      " only (repeatable)")
    output = acls.add_mutually_exclusive_group()
    output.add_argument("--markdown", action="store_true",
                        help="a table with why each is needed, then the commands")
    output.add_argument("--apply", action="store_true",
                        help="grant them on the broker of the settings, whose credentials"
                        " must be an administrator's; return once the broker applies them")
    output.add_argument("--revoke", action="store_true", help="take them away again")
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

        return run_create_topics(args.tenant)
    if args.command == "tap":
        from processors.runtime.tap_server import run_tap

        return run_tap()
    if args.command == "demo":
        from processors.tools.demo import run_demo

        return run_demo(args.replay_only, args.worker_env)
    if args.command == "hash-token":
        return _hash_token(args.tenant)
    if args.command == "acls":
        return _print_acls(args)
    raise AssertionError(args.command)  # argparse rejects unknown commands


def _hash_token(tenant: str) -> int:
    from processors.view.tenant_tokens import token_line

    try:
        print(token_line(tenant, sys.stdin.readline().rstrip("\r\n")))
    except ValueError as error:
        print(f"agui-stream hash-token: {error}", file=sys.stderr)
        return 2
    return 0


def _print_acls(args: argparse.Namespace) -> int:
    import asyncio

    from processors.config import ConfigError, Settings
    from processors.runtime.kafka_access import AclsNotChanged, change_acls, layout
    from topics.acls import acl_document, deployment_acls

    principals = {"worker": args.worker, "history_service": args.history_service,
                  "history_group": args.history_group, "agent_server": args.agent_server}
    try:
        settings = Settings.from_env()
        if not (args.apply or args.revoke):
            print(acl_document(layout(settings), markdown=args.markdown, tenants=args.tenant,
                               **principals))
            return 0
        acls = deployment_acls(layout(settings), tenants=args.tenant, **principals)
        asyncio.run(change_acls(settings, acls, grant=args.apply))
    except (ConfigError, ValueError, AclsNotChanged) as error:
        print(f"agui-stream acls: {error}", file=sys.stderr)
        return 2
    print(f"{'granted' if args.apply else 'revoked'} {len(acls)} ACLs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
