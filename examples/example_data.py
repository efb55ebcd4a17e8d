"""The LETOR fold the examples train on: yours (--data-dir) or a small generated one.

Shared by the example scripts; copy it beside the one you copy.
"""

import contextlib
import tempfile

from tfapprox.data import find_split_files, write_splits


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
    one (tfapprox.data.write_splits) in a temporary directory removed afterwards."""
    if args.data_dir:
        yield find_split_files(args.data_dir)
        return
    with tempfile.TemporaryDirectory(prefix="tfapprox-example-") as directory:
        yield write_splits(directory, args.queries, args.docs, args.features)
