"""Command line: ``kvindex`` / ``python -m kvindex``.

``kvindex simulate`` (the default when no command is given) replays a workload through both
index designs and compares them; ``kvindex demo`` prints the hash-chain worked examples of
the vLLM design notes, computed by the library.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from collections.abc import Sequence

_DESCRIPTION = """\
kvindex: the KV-cache prefix index for LLM schedulers (vLLM-style hash chain, SGLang-style
radix tree). `simulate` replays a workload through both designs and compares them; `demo`
prints the hash-chain worked examples of the vLLM design notes, computed by the library.
"""

_EPILOG = """\
With no command, kvindex runs `simulate`: `kvindex --trace F` is `kvindex simulate --trace F`.
`kvindex simulate --help` lists its options.
"""


def build_parser() -> argparse.ArgumentParser:
    """The ``kvindex`` parser: ``simulate`` (default) and ``demo`` subcommands.

    ``simulate``'s options are accepted on the top level too (hidden from its help), which
    is how the default command is spelled with argparse alone: with no subcommand word the
    top-level parser reads them and ``cmd`` keeps its default, ``simulate``.
    """
    from kvindex import __version__
    from kvindex.simulate.cli import DESCRIPTION, EPILOG, add_arguments

    simulate_options = argparse.ArgumentParser(add_help=False)
    add_arguments(simulate_options, hidden=True)  # `kvindex --help` lists the commands only
    parser = argparse.ArgumentParser(
        prog="kvindex",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[simulate_options],
    )
    parser.add_argument("-V", "--version", action="version", version=f"kvindex {__version__}")
    parser.set_defaults(cmd="simulate")
    sub = parser.add_subparsers(dest="cmd", title="commands", metavar="{simulate,demo,explain}")
    sim = sub.add_parser(
        "simulate",
        help="replay a workload through both index designs and compare (default)",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(sim, defaults=False)
    sub.add_parser(
        "demo",
        help="print the hash-chain worked examples of the vLLM design notes",
        description="Prints the hash-chain worked examples of the vLLM design notes, as "
        "computed by the library.",
    )
    from kvindex._explain import build_parser as explain_parser

    explain_parser(
        sub.add_parser(
            "explain",
            help="what a model's KV cache groups can hit, and why not",
            description="What a model's KV cache groups (a preset or a JSON layout) can hit for "
            "a prompt length or a trace, and why not, by the core group rules.",
        )
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kvindex`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.cmd == "explain":
        from kvindex._explain import run as run_explain

        return run_explain(args)
    if args.cmd == "demo":
        from kvindex._demo import run_demo

        for line in run_demo():
            print(line)
        return 0
    from kvindex.simulate.cli import guarded_run

    args.command_line = shlex.join(["kvindex", *argv])
    prog = "kvindex simulate" if "simulate" in argv else "kvindex"
    return guarded_run(args, prog)


if __name__ == "__main__":
    sys.exit(main())
