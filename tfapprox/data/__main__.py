"""Command line: ``python -m tfapprox.data {convert,check,synthetic} ...``.

  convert INPUT... --output DIR [--shards N] [--num-features F] [--format elwc|sequence_example]
          [--query-file FILE]...
      LETOR/SVMlight text (plain or .gz) -> DIR/part-*.tfrecord + DIR/spec.json. A single directory
      INPUT holding Fold<N>/ directories (or train/vali/test files) is converted split by split into
      DIR/[Fold<N>/]<split>/. Lines without qid: (LightGBM/XGBoost) take their queries from
      INPUT.query or INPUT.group beside each input, or from --query-file (one per INPUT, in order).
  check PATTERN...
      Reads every record; names the file that is corrupt, truncated or disagrees on the feature count.
  spec RECORDS... --label KEY [--vocabulary FEATURE=FILE]... [--out FILE] [--sample N]
      Reads the first N lists of ELWC or SequenceExample records with named features and writes
      their feature spec (JSON, docs/data.md "Feature specs") to FILE, or prints it.
  synthetic DIR [--queries Q] [--docs D | --lengths mslr] [--features F] [--levels 3|5] [--seed S]
      Writes generated DIR/{train,vali,test}.txt with learnable labels.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from tfapprox.data import converter, dataset, letor, shards, spec_inference, synthetic


def _convert(args) -> int:
    options = dict(
        num_shards=args.shards,
        num_features=args.num_features,
        record_format=args.format,
        assume_contiguous=args.assume_contiguous,
        overwrite=args.overwrite,
        max_label=args.max_label,
    )
    if args.query_files:
        options["query_files"] = args.query_files
    start = time.perf_counter()
    inputs = [Path(p) for p in args.inputs]
    if len(inputs) == 1 and inputs[0].is_dir():
        if args.query_files:
            raise SystemExit("error: --query-file goes with input files; in a fold directory each "
                             "file's group sizes are read from <file>.query beside it")
        specs = converter.convert_tree(inputs[0], args.output, **options)
    elif any(p.is_dir() for p in inputs):
        raise SystemExit("error: give either one directory (fold layout) or LETOR files, not both")
    else:
        specs = {".": converter.convert(inputs, args.output, **options)}
    elapsed = time.perf_counter() - start
    total_docs = 0
    for name, spec in specs.items():
        total_docs += spec["num_docs"]
        print(
            f"{Path(args.output) / name}: {spec['num_lists']} lists, {spec['num_docs']} docs, "
            f"{spec['num_features']} features, labels {spec['label_min']:g}..{spec['label_max']:g} "
            f"({'integers' if spec['integer_labels'] else 'not all integers'}), "
            f"{len(spec['shards'])} shard(s), format {spec['format']}"
        )
        print(f"  {_missing_summary(spec)}")
        if spec.get("noncontiguous_queries"):
            print(
                f"  {spec['noncontiguous_queries']} queries whose lines are not contiguous (their "
                "query id comes back after another query's lines) were each read as one list; "
                "RankLib starts a new list instead. Pass --assume-contiguous to refuse such input."
            )
    rate = total_docs / max(elapsed, 1e-9)
    print(f"converted {total_docs} docs in {elapsed:.1f}s ({rate:,.0f} docs/s)")
    return 0


def _missing_summary(spec: dict) -> str:
    """One line: how many values were missing (NULL or nan), in all and per feature that has any."""
    counts = spec.get("missing_values") or []
    total = sum(counts)
    if not total:
        return "missing values (NULL or nan): none"
    share = total / max(1, spec["num_docs"] * spec["num_features"])
    per_feature = ", ".join(f"{i}:{n}" for i, n in enumerate(counts, 1) if n)
    return (f"missing values (NULL or nan, read as NaN): {total} ({share:.1%}); per feature "
            f"(index:count) {per_feature}")


def _max_label(text: str) -> float | None:
    return None if text.lower() == "none" else float(text)


def _check(args) -> int:
    files = dataset.describe(args.patterns).files
    totals = dataset.check_records(files, args.num_features)
    print(json.dumps({"files": len(files), **totals}))
    return 0


def _spec(args) -> int:
    vocabularies = {}
    for item in args.vocabularies:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--vocabulary takes FEATURE=FILE; got {item!r}")
        vocabularies[name] = path
    out = None if args.out is None else Path(args.out)
    if out is not None and os.path.lexists(out):
        raise FileExistsError(f"{out} exists; the spec goes to a new file")
    spec = spec_inference.infer_spec(args.records, args.label, vocabularies, args.sample,
                                     spec_dir=None if out is None else out.parent)
    lines = spec_inference.summary(spec)
    if out is None:
        print(json.dumps(spec.to_dict(), indent=2))
        print("\n".join(lines), file=sys.stderr)
    else:
        spec.save(out)
        print(f"{out}: " + "\n".join(lines))
    return 0


def _synthetic(args) -> int:
    if args.lengths != "uniform" and args.docs is not None:
        raise ValueError(f"--docs sets uniform list lengths; --lengths {args.lengths} has its own")
    paths = synthetic.write_splits(
        args.output,
        args.queries,
        40 if args.docs is None else args.docs,
        args.features,
        label_levels=args.levels,
        noise=args.noise,
        seed=args.seed,
        lengths=args.lengths,
    )
    for split, path in paths.items():
        print(f"{split}: {path}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfapprox.data", description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--verbose", action="store_true",
                        help="show TensorFlow's start-up and C++ log messages (hidden by default)")

    p = commands.add_parser("convert", parents=[common], help="LETOR text -> sharded TFRecords + spec.json")
    p.add_argument("inputs", nargs="+", help="LETOR/SVMlight files, or one fold-layout directory")
    p.add_argument("--output", required=True, help="output directory")
    p.add_argument("--shards", type=int, default=1, help="number of TFRecord files (default 1)")
    p.add_argument(
        "--num-features",
        type=int,
        default=None,
        help="F (default: the largest index seen, if at most 10 x the distinct indices in use or 1000, "
        f"and never above {letor.MAX_INFERRED_FEATURES}; a larger index is an error unless F is given)",
    )
    p.add_argument("--format", default="elwc", choices=["elwc", "sequence_example"])
    p.add_argument(
        "--assume-contiguous", action="store_true", help="fail, not regroup, if a qid's lines are split"
    )
    p.add_argument("--overwrite", action="store_true", help="replace existing shards in --output")
    p.add_argument(
        "--max-label",
        type=_max_label,
        default=letor.DEFAULT_MAX_LABEL,
        help=f"largest label accepted (default {letor.DEFAULT_MAX_LABEL}: NDCG's gain 2^label - 1 "
        "loses precision beyond; 'none': any)",
    )
    p.add_argument(
        "--query-file",
        dest="query_files",
        action="append",
        metavar="FILE",
        help="group sizes (documents per query, one integer a line: LightGBM's .query, XGBoost's "
        ".group) for inputs without qid:, once per INPUT in order (default: INPUT.query or "
        "INPUT.group beside it)",
    )
    p.set_defaults(run=_convert)

    p = commands.add_parser("check", parents=[common], help="read every record and verify counts")
    p.add_argument("patterns", nargs="+", help="TFRecord files, globs or directories")
    p.add_argument("--num-features", type=int, default=None)
    p.set_defaults(run=_check)

    p = commands.add_parser("spec", parents=[common],
                            help="infer the feature spec of records with named features")
    p.add_argument("records", nargs="+", help="TFRecord files, globs or directories (ELWC or "
                   "SequenceExample lists)")
    p.add_argument("--label", required=True, help="the document feature that holds the label")
    p.add_argument("--vocabulary", dest="vocabularies", action="append", default=[],
                   metavar="FEATURE=FILE", help="a string (or int64) feature's vocabulary file, "
                   "one value a line; needed for each string feature")
    p.add_argument("--out", default=None, help="the spec file to write (new); default: print it")
    p.add_argument("--sample", type=int, default=1000, help="lists read (default 1000)")
    p.set_defaults(run=_spec)

    p = commands.add_parser("synthetic", parents=[common], help="write generated train/vali/test LETOR files")
    p.add_argument("output", help="output directory")
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--docs", type=int, default=None,
                   help="mean documents per query, lengths uniform in D/2..3D/2 (default 40)")
    p.add_argument("--lengths", default="uniform", choices=synthetic.LENGTHS,
                   help="uniform (default, see --docs) or mslr: like MSLR-WEB30K's, log-normal with "
                   f"mean ~120, 1..{synthetic.MSLR_MAX_LIST} documents")
    p.add_argument("--features", type=int, default=40)
    p.add_argument("--levels", type=int, default=5, choices=[2, 3, 5])
    p.add_argument("--noise", type=float, default=0.5)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(run=_synthetic)

    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (letor.LetorFormatError, shards.RecordError, OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
