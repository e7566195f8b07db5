"""The ``pyrobnn`` command."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def _demo(args) -> int:
    from pyrobnn.demo import format_table, run_demo

    rows = run_demo(args.out, seed=args.seed, epochs=args.epochs, num_samples=args.samples, progress=not args.quiet)
    print(format_table(rows))
    print(f"plots and results in {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pyrobnn", description="Bayesian neural networks on Pyro")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="fit a mean-field and a variational-dropout BNN to a toy regression")
    demo.add_argument("--out", default="pyrobnn-demo", help="folder for the table and plots")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--epochs", type=int, default=3000, help="full-batch SVI steps per method")
    demo.add_argument("--samples", type=int, default=500, help="posterior samples for prediction")
    demo.add_argument("--quiet", action="store_true", help="no progress bars")
    demo.set_defaults(run=_demo)
    return parser


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
