"""`python -m licensectl_dev.devcluster build|build-tools|up`: the real control plane and Go tools for development."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from collections.abc import Sequence

from licensectl_dev.devcluster.controlplane import (
    BuildError,
    ControlPlane,
    ControlPlaneError,
    ensure_binaries,
    ensure_scheduler,
)
from licensectl_dev.devcluster.gotools import TOOLS, ensure_tools
from licensectl_dev.devcluster.kubeapi import api_client_from_kubeconfig, install_crds
from licensectl_dev.devcluster.virt_api import RestartProxy
from licensectl_dev.devcluster.virt_controller import KubevirtSimulator


def _out(msg: str) -> None:
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


async def _serve(cp: ControlPlane, ready_delay: float, kubevirt: bool) -> None:
    api = await api_client_from_kubeconfig(cp.kubeconfig_path)
    sim: KubevirtSimulator | None = None
    proxy: RestartProxy | None = None
    try:
        names = await install_crds(api)
        _out(f"CRDs installed: {', '.join(names)}")
        if kubevirt:
            sim = KubevirtSimulator(api, ready_delay=ready_delay)
            await sim.start()
            proxy = RestartProxy(sim, upstream=cp.server, ca_path=cp.ca_path, token=cp.admin_token,
                                 tls=cp.issue_serving_cert("kubevirt-proxy"))
            await proxy.start()
        _out(f"kube-apiserver {cp.version} at {cp.server}")
        _out(f"kubeconfig (direct):            {cp.kubeconfig_path}")
        if proxy is not None:
            _out(f"kubeconfig (KubeVirt restart): {proxy.kubeconfig_path}")
        _out(f"kubectl: {cp.kubectl} --kubeconfig {cp.kubeconfig_path} get ns")
        _out("running; press Ctrl-C to stop")
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        if proxy is not None:
            await proxy.stop()
        if sim is not None:
            await sim.stop()
        await api.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m licensectl_dev.devcluster", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build (or find cached) etcd, kube-apiserver, kube-controller-manager, kubectl "
                   "and kube-scheduler")
    tools = sub.add_parser("build-tools", help="build (or find cached) the Go tools the tests run: "
                           + ", ".join(TOOLS))
    tools.add_argument("names", nargs="*", metavar="NAME", help="tools to build (default: all)")
    up = sub.add_parser("up", help="start the control plane + CRDs + KubeVirt simulator until Ctrl-C")
    up.add_argument("--ready-delay", type=float, default=0.5, help="seconds until a new VMI is Ready")
    up.add_argument("--no-kubevirt", action="store_true", help="do not run the KubeVirt simulator/proxy")
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            _out(str(ensure_binaries()))
            _out(str(ensure_scheduler()))  # tenant clusters' control planes (tests, demo)
            return 0
        if args.command == "build-tools":
            for name, path in ensure_tools(args.names or None).items():
                _out(f"{name}: {path}")
            return 0
        with ControlPlane() as cp:
            asyncio.run(_serve(cp, args.ready_delay, not args.no_kubevirt))
        _out("stopped; temporary files removed")
        return 0
    except (BuildError, ControlPlaneError) as e:
        sys.stderr.write(f"error: {e}\n")
        return 1


if __name__ == "__main__":
    sys.exit(main())
