"""`gpusteward policy`: check a policy file, print the policy's JSON Schema."""

from __future__ import annotations

import argparse
import json

from gpusteward.adapters.policyfile import load_policy
from gpusteward.core.policyschema import policy_schema


def add_policy_flags(pol: argparse.ArgumentParser) -> None:
    pol_sub = pol.add_subparsers(dest="policy_command", required=True)
    check = pol_sub.add_parser("check", help="validate a policy file (exit 0 valid, 2 invalid)")
    check.add_argument("file", help="the policy YAML file")
    pol_sub.add_parser("schema", help="print the policy's JSON Schema (deploy/policy.schema.json)")


def run_policy(args: argparse.Namespace) -> int:
    """A valid file prints one line; an invalid one raises PolicyError naming every problem."""
    if args.policy_command == "schema":
        print(json.dumps(policy_schema(), indent=2))
        return 0
    load_policy(args.file)
    print(f"{args.file}: valid")
    return 0
