"""The ``pyrobnn`` command."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main", "parse_splits"]


def _demo(args) -> int:
    from pyrobnn.apps.demo import format_table, run_demo

    rows = run_demo(args.out, seed=args.seed, epochs=args.epochs, num_samples=args.samples, progress=not args.quiet)
    print(format_table(rows))
    print(f"plots and results in {args.out}")
    return 0


def parse_splits(text):
    """``--splits``: comma-separated split numbers and inclusive ranges (``0-4,7``), each split
    once; an ``argparse`` type, so a bad value is reported as a usage error naming it."""
    out = []
    for part in text.split(","):
        part = part.strip()
        lo, sep, hi = part.partition("-")
        if not part or not lo.isdigit() or (sep and not hi.isdigit()):
            raise argparse.ArgumentTypeError(f"{part!r} in {text!r} is not a split number or a range like 0-4")
        if sep and int(hi) < int(lo):
            raise argparse.ArgumentTypeError(f"the range {part!r} in {text!r} is empty (its start is above its end)")
        out.extend(range(int(lo), int(hi) + 1) if sep else [int(lo)])
    repeated = sorted({v for v in out if out.count(v) > 1})
    if repeated:
        raise argparse.ArgumentTypeError(f"{text!r} lists split(s) {repeated} more than once")
    return out


def _compare(args) -> int:
    from pyrobnn.apps.compare import degenerate_warning, format_markdown, run_compare

    rows = run_compare(
        dataset=args.dataset,
        out_dir=args.out,
        data_dir=args.data_dir,
        splits=args.splits,
        methods=args.methods.split(",") if args.methods else None,
        quick=args.quick,
        seed=args.seed,
        progress=not args.quiet,
        resume=not args.no_resume,
        reference=args.reference,
    )
    print(format_markdown(args.dataset, rows, args.quick))
    print(f"tables, plots and the reference's diagnostics in {args.out}")
    reference = next((r for r in rows if r.get("key") == "reference"), {})
    if reference.get("degenerate_splits"):
        print(degenerate_warning(reference), file=sys.stderr)
        return 3
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

    from pyrobnn.apps.compare import METHODS, REFERENCES

    compare = sub.add_parser("compare", help="a sampling reference beside deep ensembles and every VI method on a small regression problem")
    compare.add_argument("--dataset", default="toy", help="'toy' (generated, with a gap in the inputs) or a UCI set such as yacht")
    compare.add_argument("--data-dir", default=None, help="folder holding uci/<name> (default $PYROBNN_DATA)")
    compare.add_argument("--splits", default=None, type=parse_splits, help="UCI splits, e.g. 0-4 or 0,3,7 (default: all)")
    compare.add_argument(
        "--methods", default=None,
        help=f"comma-separated subset of the methods: {', '.join(k for k in METHODS if k != 'reference')} (the reference always runs)",
    )
    compare.add_argument(
        "--reference", default="ensemble-mclmc", choices=list(REFERENCES),
        help="the reference sampler: one MCLMC (default) or NUTS chain per deep-ensemble member, or NUTS from random starts",
    )
    compare.add_argument("--out", default="pyrobnn-compare")
    compare.add_argument("--seed", type=int, default=0)
    compare.add_argument("--quick", action="store_true", help="short runs, for a check that everything works")
    compare.add_argument("--quiet", action="store_true", help="no progress bars")
    compare.add_argument("--no-resume", action="store_true", help="run every UCI split afresh instead of reusing those saved in OUT/splits")
    compare.set_defaults(run=_compare)
    return parser


def main(argv=None) -> int:
    """Run the command; an expected failure (a refused argument, missing or malformed data, a
    path that cannot be written) prints one line naming it and returns 2, without a traceback."""
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, OSError) as e:
        print(f"pyrobnn {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
