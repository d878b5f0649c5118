"""The `licensectl` command: run, status, rollout, keys, config-reference.

Subcommands import their machinery lazily so `licensectl --help` stays instant.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import sys
import traceback
from collections.abc import Sequence

from licensectl import __version__, config, malloc


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="licensectl",
        description="NVIDIA vGPU license lifecycle for Cozystack + KubeVirt: replicate, rotate, observe.",
        epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"licensectl {__version__}")
    p.add_argument("--debug", action="store_true", help="show the Python traceback of an error")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", help="run the controller (in-cluster or with a kubeconfig)")
    config.add_arguments(run)

    status = sub.add_parser("status", help="sources, revisions, replicas, rollout and guests at a glance, "
                                           "as the running controller decided them",
                            epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    status.add_argument("-o", "--output", choices=("table", "json"), default="table")
    status.add_argument("--kubeconfig", default=None)
    status.add_argument("--context", default=None)
    _controller_arguments(status)

    rollout = sub.add_parser("rollout", help="rollout status / history / pause / resume / retry / undo")
    rsub = rollout.add_subparsers(dest="rollout_command", metavar="VERB", required=True)
    rs = rsub.add_parser("status", help="progress per wave; exit 0 complete, 4 paused, 5 aborted (see below)",
                         epilog=ROLLOUT_STATUS_EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    rs.add_argument("--watch", "-w", action="store_true",
                    help="follow until the rollout completes (0), pauses (4) or its rotation is aborted or undone "
                         "(5, at the decision); an answer from a standby or a starting replica is unknown: it keeps "
                         "waiting")
    rs.add_argument("--timeout", type=float, default=0.0, help="give up after this many seconds (0: never; exit 2)")
    rs.add_argument("-o", "--output", choices=("text", "json", "yaml"), default="text")
    rs.add_argument("--vms", action="store_true",
                    help="also list the failed, blocked, undeliverable, manual, restarting, draining and "
                         "awaiting-evidence VMIs with their reasons")
    _controller_arguments(rs)
    helps = {"pause": "pause the rollout of a source Secret", "resume": "resume the rollout of a source Secret",
             "retry": "start an aborted or undone candidate again from the canary",
             "undo": "return every namespace to the stable source revision (the candidate is bad)"}
    for verb, text in helps.items():
        v = rsub.add_parser(verb, help=text, epilog=ACTION_EXIT_CODES,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        v.add_argument("source", type=source_ref, help="NAMESPACE/NAME of the source Secret")
        v.add_argument("--namespace", default=None,
                       help="licensectl's namespace, where the rotation records live (default: LICENSECTL_NAMESPACE)")
    hist = rsub.add_parser("history", help="the source revisions of a source and how each ended (promoted, "
                                           "aborted, undone, superseded, withdrawn)",
                           epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    hist.add_argument("source", type=source_ref, help="NAMESPACE/NAME of the source Secret")
    hist.add_argument("-o", "--output", choices=("table", "json"), default="table")
    hist.add_argument("--namespace", default=None,
                      help="licensectl's namespace, where the rotation records live (default: LICENSECTL_NAMESPACE)")
    worker_helps = {"retry-worker": "restart a tenant worker down after BootTimeout once more, with a fresh boot "
                                    "window (its cause fixed)",
                    "skip-worker": "give a tenant worker down after BootTimeout up: no longer counted as down, not "
                                   "restarted for this revision"}
    for verb, text in worker_helps.items():
        rw = rsub.add_parser(verb, help=text, epilog=WORKER_EXIT_CODES,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        rw.add_argument("worker", type=vm_ref, help="NAMESPACE/NAME of the worker's VirtualMachine")
    for r in rsub.choices.values():
        r.add_argument("--kubeconfig", default=None)
        r.add_argument("--context", default=None)
        _debug_argument(r)
    _debug_argument(status)
    rs.add_argument("source", nargs="?", type=source_ref,
                    help="NAMESPACE/NAME of the source Secret (default: all)")

    keys = sub.add_parser("keys", help="the guest-report signing key")
    ksub = keys.add_subparsers(dest="keys_command", metavar="VERB", required=True)
    kr = ksub.add_parser("rotate", help="new signing key; older keys stay valid while running VMs hold them")
    kr.add_argument("--revoke-older", action="store_true",
                    help="end every older key now; names the VMs that stop reporting until they restart")
    _debug_argument(kr)
    kr.add_argument("--kubeconfig", default=None)
    kr.add_argument("--context", default=None)
    kr.add_argument("--namespace", default=None, help="licensectl's namespace (default: LICENSECTL_NAMESPACE)")

    for leaf in (run, status, *rsub.choices.values(), kr):
        leaf.set_defaults(usage_parser=leaf)

    ref = sub.add_parser("config-reference", help="print the configuration reference (markdown)")
    ref.add_argument("--format", choices=("markdown", "helm-values", "helm-schema"), default="markdown",
                     help="markdown: the README table; helm-values / helm-schema: the chart's config block")
    ref.set_defaults(usage_parser=ref)
    return p


def source_ref(text: str) -> str:
    """SOURCE of every verb: NAMESPACE/NAME, checked while parsing, so a bad one is a usage error
    (exit 2, the verb's usage) before any cluster is needed."""
    ns, _, name = text.partition("/")
    if not ns or not name or "/" in name:
        raise argparse.ArgumentTypeError(f"SOURCE must be NAMESPACE/NAME (e.g. licensectl-system/vws-token), "
                                          f"not {text!r}")
    return text


def vm_ref(text: str) -> str:
    """A worker VirtualMachine, NAMESPACE/NAME, checked while parsing like SOURCE (exit 2, the verb's usage)."""
    ns, _, name = text.partition("/")
    if not ns or not name or "/" in name:
        raise argparse.ArgumentTypeError(f"VM must be NAMESPACE/NAME (e.g. tenant-a/cluster-md-0), not {text!r}")
    return text


def _debug_argument(p: argparse.ArgumentParser) -> None:
    """`--debug` after the command too; SUPPRESS keeps a top-level `licensectl --debug CMD` intact."""
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show the Python traceback of an error")


def _controller_arguments(p: argparse.ArgumentParser) -> None:
    """How the read-only commands reach the controller's /v1/status (licensectl.cli.status; its
    STATUS_SERVICE / STATUS_SERVICE_PORT are the defaults, kept out of here so --help stays instant)."""
    p.add_argument("--namespace", default=None,
                   help="licensectl's namespace (default: LICENSECTL_NAMESPACE, else licensectl-system)")
    p.add_argument("--service", default=None,
                   help="Service in front of the controller's internal listener (default: licensectl-metrics), "
                        "reached through the API server's services/proxy")
    p.add_argument("--service-port", default=None,
                   help="port name or number of that Service (default: metrics)")
    p.add_argument("--url", default=None,
                   help="the controller's internal URL instead (e.g. http://127.0.0.1:8080 through "
                        "`kubectl port-forward`)")
    p.add_argument("--offline", action="store_true",
                   help="do not ask the controller: recompute from the cluster with local defaults (no guests)")


def _command_settings(args: argparse.Namespace) -> config.Settings:
    """Settings from the environment, with the command's --kubeconfig/--context taking precedence."""
    s = config.settings_from(None)
    return dataclasses.replace(s, kubeconfig=getattr(args, "kubeconfig", None) or s.kubeconfig,
                               context=getattr(args, "context", None) or s.context)


EXIT_CODES = """exit codes:
  0  done
  1  error, or an action refused (one line on stderr: no kubeconfig, API server unreachable,
     forbidden, not found, "is already paused", ...; the traceback only with --debug)
  2  usage error
`rollout status` also: 2 timed out, 3 still in progress (no --watch), 4 paused, 5 rotation aborted
or undone, 6 unknown (only a standby or a starting replica answered; no --watch).
See docs/operations.md#cli-exit-codes."""

ROLLOUT_STATUS_EXIT_CODES = """exit codes:
  0  complete: every selected source's VMIs current and no rotation running
  1  error (cluster or controller unreachable and no offline view, unknown source)
  2  --timeout passed
  3  still in progress (without --watch)
  4  paused: by hand (`rollout resume`), or the failure budget is spent
  5  the rotation was aborted or undone: every namespace back on stable, waiting for you (VMIs not
     back on stable yet are named)
  6  unknown (without --watch): only a standby or a starting (unsynced) replica answered; ask again
-o json: one document (`exit_code` is the exit code); with --watch one per line (JSON Lines), each
with the code that look exits with, `final` true on the last (the command's exit code)"""

ACTION_EXIT_CODES = """exit codes:
  0  written: the annotation on the source Secret and one Event on it
  1  refused (e.g. "is already paused", "is not paused", "no rollout history found", not a source
     Secret) or failed (no kubeconfig, API server unreachable, forbidden, not found)
  2  usage error"""


WORKER_EXIT_CODES = """exit codes:
  0  written: licensectl.io/drain-retry-at (or drain-skip-at) on the VM and one Event on it
  1  refused (not a worker down after BootTimeout, a retry or skip already pending) or failed
  2  usage error"""


def _cluster_command(args: argparse.Namespace) -> int:
    """status / rollout * / keys: every error becomes one line on stderr and exit 1 (traceback with --debug)."""
    from licensectl import logs
    from licensectl.cli.errors import describe

    logs.configure("console", "warning")  # stdout is for the command's output
    name = " ".join(str(x) for x in (args.command, getattr(args, "rollout_command", None),
                                     getattr(args, "keys_command", None)) if x)
    try:
        settings = _command_settings(args)
        if args.command == "status":
            from licensectl.cli.status import status_main

            return asyncio.run(status_main(args, settings))
        if args.command == "rollout" and args.rollout_command == "status":
            from licensectl.cli.status import rollout_status_main

            return asyncio.run(rollout_status_main(args, settings))
        if args.command == "rollout" and args.rollout_command == "history":
            from licensectl.cli.history import rollout_history_main

            return asyncio.run(rollout_history_main(args, settings))
        if args.command == "rollout" and args.rollout_command in ("retry-worker", "skip-worker"):
            from licensectl.cli.worker_actions import worker_action_main

            return asyncio.run(worker_action_main(args, settings))
        if args.command == "rollout":  # pause | resume | retry | undo
            from licensectl.cli.actions import rollout_action_main

            return asyncio.run(rollout_action_main(args, settings))
        from licensectl.cli.keys import keys_rotate_main

        return asyncio.run(keys_rotate_main(args, settings))
    except KeyboardInterrupt:
        return 130
    except Exception as e:
        if getattr(args, "debug", False):
            traceback.print_exc()
        print(f"licensectl {name}: {describe(e)}", file=sys.stderr)
        return 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # the usage of the (sub)command they were given to, not the top level's
        getattr(args, "usage_parser", parser).error(f"unrecognized arguments: {' '.join(extra)}")
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "config-reference":
        if args.format == "helm-values":
            print(config.reference_helm_values(), end="")
        elif args.format == "helm-schema":
            print(json.dumps(config.helm_values_schema(), indent=2))
        else:
            print(config.reference_markdown(), end="")
        return 0
    if args.command == "run":
        try:
            settings = config.settings_from(args)
        except ValueError as e:
            print(f"licensectl run: {e}", file=sys.stderr)
            return 2
        from licensectl import event_loop
        from licensectl.app import run

        malloc.limit_arenas()  # before any thread exists: the planner threads share one arena
        return event_loop.run(run(settings))
    if args.command in ("status", "rollout", "keys"):
        return _cluster_command(args)
    parser.error(f"unknown command {args.command}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
