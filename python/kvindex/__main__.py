"""Command line: ``kvindex`` / ``python -m kvindex``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvindex`` console script."""
    parser = argparse.ArgumentParser(prog="kvindex", description=__doc__)
    sub = parser.add_subparsers(dest="cmd")
    sub.add_parser("demo", help="print the seed notes' worked examples from the real library")
    args = parser.parse_args(argv)
    if args.cmd in (None, "demo"):
        from kvindex._demo import run_demo

        for line in run_demo():
            print(line)
        return 0
    parser.error(f"unknown command {args.cmd}")
    return 2


if __name__ == "__main__":
    sys.exit(main())
