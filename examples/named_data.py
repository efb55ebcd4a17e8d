"""What the two TF-Ranking-style examples share: their records (yours or generated), their spec,
training with NDCG metrics, and the saved model reloaded to score.

Shared by keras_dnn_tfrecord.py and antique_kpl_din.py; copy it beside the one you copy.
"""

import contextlib
import dataclasses
import tempfile
from pathlib import Path

import keras
import numpy as np

import tfapprox
from tfapprox.data import FeatureSpec, infer_spec, write_named

METRICS = ("ndcg@1", "ndcg@5", "ndcg@10", "map")  # compiled into the models, printed on test


def add_named_flags(parser, label, num_lists, epochs):
    """Adds the records', the spec's and training's flags (TF-Ranking's names, with dashes)."""
    parser.add_argument("--data-dir", help="a directory of train.tfrecord, vali.tfrecord, "
                        "test.tfrecord (ELWC or SequenceExample); default: generated records in a "
                        "temporary directory")
    for split, name in (("train", "train"), ("vali", "valid"), ("test", "test")):
        parser.add_argument(f"--{name}-input-pattern", dest=split,
                            help=f"the {split} records (a file, glob or directory); overrides "
                            "--data-dir")
    parser.add_argument("--label", default=label, help="the document feature that holds the grade")
    parser.add_argument("--spec", help="a spec file (python -m tfapprox.data spec); default: "
                        "inferred from the training records")
    parser.add_argument("--num-lists", type=int, default=num_lists, help="generated records: lists")
    parser.add_argument("--num-epochs", type=int, default=epochs)
    parser.add_argument("--train-batch-size", type=int, default=16, help="lists per step")
    parser.add_argument("--valid-batch-size", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=0.05)
    parser.add_argument("--loss", default="approx_ndcg_loss", help="a key of tfapprox.losses.get "
                        "(TF-Ranking's RankingLossKey strings too)")
    parser.add_argument("--dropout", type=float, default=0.5, help="dropout after hidden blocks")
    parser.add_argument("--hidden-layer-dims", default="64,32,16", help="hidden widths")
    parser.add_argument("--model-dir", help="where model.keras goes; default: a temporary one")


def hidden_units(args):
    """The widths of --hidden-layer-dims, "64,32,16" -> [64, 32, 16]."""
    return [int(width) for width in args.hidden_layer_dims.split(",") if width.strip()]


@contextlib.contextmanager
def named_splits(args, kind):
    """Yields `{"train", "vali", "test"}` record paths (and `"vocabulary"` for `kind="tokens"`):
    the --*-input-pattern flags, --data-dir's files, or `write_named(kind)` records in a temporary
    directory removed afterwards."""
    with contextlib.ExitStack() as stack:
        if args.data_dir:
            directory = Path(args.data_dir)
        elif args.train:
            directory = None
        else:
            directory = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="tfapprox-")))
            write_named(directory, kind, num_lists=args.num_lists)
        splits = {}
        for split in ("train", "vali", "test"):
            default = directory and str(directory / f"{split}.tfrecord")
            splits[split] = getattr(args, split) or default
            if not splits[split]:
                raise SystemExit(f"error: no {split} records: give --data-dir or all three "
                                 "--*-input-pattern flags")
        if directory is not None and (directory / "vocab.txt").is_file():
            splits["vocabulary"] = str(directory / "vocab.txt")
        yield splits


def feature_spec(args, train, vocabularies=None, **changes):
    """The spec of --spec, or one inferred from the `train` records with --label (`infer_spec`,
    what `python -m tfapprox.data spec` writes), with each document feature's fields replaced by
    `changes`."""
    spec = FeatureSpec.load(args.spec) if args.spec else infer_spec(train, args.label, vocabularies)
    if changes:
        spec = dataclasses.replace(spec, document=tuple(
            dataclasses.replace(f, **{k: v for k, v in changes.items() if k in applies(f)})
            for f in spec.document))
    return spec


def applies(feature):
    """The fields a change may set on `feature`: a transform on numbers, a width on embeddings."""
    return {"embedding_dim"} if feature.categorical else {"transform"} if feature.numeric else set()


def compile_for_ranking(model, args):
    """Compiles `model` with --loss, Adagrad at --learning-rate (TF-Ranking's default optimizer),
    and NDCG@1, @5, @10 and MAP, the metrics printed after training."""
    model.compile(optimizer=keras.optimizers.Adagrad(args.learning_rate),
                  loss=tfapprox.losses.get(args.loss),
                  metrics=[tfapprox.metrics.get(key) for key in METRICS])


def fit_and_evaluate(model, train, vali, test, args):
    """Trains `model` for --num-epochs on `train` (validating on `vali`) and prints its measures
    on `test`."""
    # shuffle=False: ranking_dataset already shuffles the lists, anew each epoch
    model.fit(train, validation_data=vali, epochs=args.num_epochs, shuffle=False, verbose=2)
    result = model.evaluate(test, verbose=0, return_dict=True)
    print("test " + ", ".join(f"{key.upper()} {result[key]:.4f}" for key in METRICS))


@contextlib.contextmanager
def model_dir(args):
    """Yields --model-dir (created), or a temporary directory removed afterwards."""
    if args.model_dir:
        Path(args.model_dir).mkdir(parents=True, exist_ok=True)
        yield Path(args.model_dir)
        return
    with tempfile.TemporaryDirectory(prefix="tfapprox-model-") as directory:
        yield Path(directory)


def save_reload_and_score(model, path, test, trained_scores):
    """Saves `model` to `path` (.keras), loads it back and scores the `test` lists' features with
    it, checking them against `trained_scores(features)`, the trained model's."""
    model.save(path)
    print(f"saved {path}")
    reloaded = keras.saving.load_model(path)  # tfapprox's layers are registered on import
    lists, largest = 0, 0.0
    for features, labels in test:
        valid = keras.ops.convert_to_numpy(labels) >= 0
        scores = keras.ops.convert_to_numpy(reloaded(features, training=False))
        expected = keras.ops.convert_to_numpy(trained_scores(features))
        largest = max(largest, float(np.abs(scores - expected)[valid].max()))
        lists += len(scores)
    if largest > 1e-4:
        raise SystemExit(f"error: the reloaded model's scores differ from the trained model's by "
                         f"up to {largest:.3g}")
    print(f"reloaded {path.name}: its scores on the {lists} test lists equal the trained "
          f"model's (largest difference {largest:.1e}); one list's first scores: "
          f"{', '.join(f'{score:.3f}' for score in scores[0][valid[0]][:5])}")
