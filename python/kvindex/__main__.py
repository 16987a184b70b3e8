"""Command line: ``kvindex`` / ``python -m kvindex``.

``kvindex simulate`` (the default when no command is given) replays a workload through both
index designs and compares them; ``kvindex demo`` prints the seed notes' worked examples
from the library.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

_COMMANDS = ("simulate", "demo")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvindex`` console script."""
    from kvindex.simulate.cli import DESCRIPTION, EPILOG, add_arguments, guarded_run

    args_in = list(sys.argv[1:] if argv is None else argv)
    # `simulate` is the default command: `kvindex`, `kvindex --trace F` run it.
    if not args_in or (args_in[0] not in _COMMANDS and args_in[0] not in ("-h", "--help")):
        args_in.insert(0, "simulate")
    parser = argparse.ArgumentParser(prog="kvindex", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", metavar="{simulate,demo}")
    sim = sub.add_parser(
        "simulate",
        help="replay a workload through both index designs and compare (default)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(sim)
    sub.add_parser("demo", help="print the seed notes' worked examples from the real library")
    args = parser.parse_args(args_in)
    if args.cmd == "demo":
        from kvindex._demo import run_demo

        for line in run_demo():
            print(line)
        return 0
    return guarded_run(args, "kvindex simulate")


if __name__ == "__main__":
    sys.exit(main())
