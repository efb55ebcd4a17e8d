"""The LETOR fold the examples train on: yours (--data-dir) or a small generated one.

Shared by the example scripts; copy it beside the one you copy.
"""

import contextlib
import tempfile

from tfapprox.data import NoRelevantDocument, check_relevant_documents, find_split_files, write_splits


def add_data_flags(parser, queries=200, docs=20, features=20, epochs=5):
    """Adds --data-dir and the sizes of the generated set and of training to `parser`."""
    parser.add_argument("--data-dir", help="a LETOR fold directory (train.txt, vali.txt, test.txt); "
                        "default: a generated set in a temporary directory")
    parser.add_argument("--queries", type=int, default=queries, help="generated set: queries")
    parser.add_argument("--docs", type=int, default=docs, help="generated set: mean documents per query")
    parser.add_argument("--features", type=int, default=features, help="generated set: features")
    parser.add_argument("--epochs", type=int, default=epochs)
    parser.add_argument("--batch-size", type=int, default=16, help="lists per step")


@contextlib.contextmanager
def letor_fold(args):
    """Yields `{"train": path, "vali": path, "test": path}`: the fold in --data-dir, or a generated
    one (tfapprox.data.write_splits) in a temporary directory removed afterwards. A fold that is
    not there, lacks a split, or has no relevant document to train on is one line and exit 1."""
    if args.data_dir:
        try:
            fold = find_split_files(args.data_dir)
            missing = [split for split in ("train", "vali", "test") if split not in fold]
            if missing:
                raise FileNotFoundError(f"{args.data_dir}: no {'/'.join(missing)} file")
            check_relevant_documents(fold)  # as the trainer checks it: no relevant label, no NDCG
        except (FileNotFoundError, NoRelevantDocument) as err:
            raise SystemExit(f"error: {err}") from None
        yield fold
        return
    with tempfile.TemporaryDirectory(prefix="tfapprox-example-") as directory:
        yield write_splits(directory, args.queries, args.docs, args.features)
