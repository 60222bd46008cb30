"""Build, at the lowest CPU priority, what the test suite builds from Go modules, in the order
it first needs them, while the suite runs.

On a fresh machine the suite would otherwise stop at each first use (Prometheus 3 in the
component tier, helm, kustomize and the control plane in the deployment tier, CoreDNS, KEDA,
KubeRay, Kueue, JobSet and Trainer in the e2e tier) and wait for a build of minutes. Started
beside it (tests/conftest.py), these builds use the CPU the tests leave idle; a test that needs
one sooner builds it itself, or waits on that build's lock and finds it done. Every build is
the same function the sandbox calls, cached the same way, so on a warm machine this returns
within seconds. A build that fails here is only logged: the test that needs it builds again and
reports the failure.

    python -m gpusteward.sandbox.prebuild [NAME ...]    # default: ORDER (no Thanos)
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

from gpusteward.sandbox.build import ensure_binaries
from gpusteward.sandbox.controllers import ensure_controller
from gpusteward.sandbox.renderers import ensure_renderers

__all__ = ["ORDER", "prebuild"]


def _controller(name: str) -> Callable[[], object]:
    return lambda: ensure_controller(name, log=_say)


#: Each build by the order of its first use in ``pytest tests`` (tests/component, deploy, e2e);
#: Thanos, which only the full benchmarks run, by name only.
BUILDS: dict[str, Callable[[], object]] = {
    "prometheus": _controller("prometheus"),
    "renderers": ensure_renderers,
    "sandbox": lambda: ensure_binaries(log=_say),
    **{name: _controller(name)
       for name in ("coredns", "keda", "kuberay", "kueue", "jobset", "trainer", "thanos")},
}
ORDER = tuple(name for name in BUILDS if name != "thanos")


def _say(message: str) -> None:
    print(f"prebuild: {message}", file=sys.stderr, flush=True)


def prebuild(names: tuple[str, ...] = ORDER) -> list[str]:
    """Build each of ``names`` in turn; return the ones that failed."""
    failed = []
    for name in names:
        started = time.monotonic()
        try:
            BUILDS[name]()
        except Exception as e:  # the test that needs it reports it
            _say(f"{name} failed ({e}); the test that needs it builds it again")
            failed.append(name)
        else:
            _say(f"{name} ready after {time.monotonic() - started:.0f}s")
    return failed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpusteward.sandbox.prebuild",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"what to build (default, in this order: {', '.join(ORDER)})")
    args = parser.parse_args(argv)
    if unknown := [n for n in args.names if n not in BUILDS]:
        parser.error(f"unknown: {', '.join(unknown)} (known: {', '.join(ORDER)})")
    os.nice(19)  # the tests' own processes come first
    return 1 if prebuild(tuple(args.names) or ORDER) else 0


if __name__ == "__main__":
    raise SystemExit(main())
