"""TF-Ranking's keras_dnn_tfrecord.py on tfapprox: a DNN over 136 named float features (ELWC).

    python examples/keras_dnn_tfrecord.py                    # generated records, like TF-Ranking's
    python examples/keras_dnn_tfrecord.py --use-log1p \\
        --train-input-pattern train_numerical_elwc.tfrecord \\
        --valid-input-pattern vali_numerical_elwc.tfrecord \\
        --test-input-pattern test_numerical_elwc.tfrecord --model-dir /tmp/dnn

The records hold per document some of `custom_features_1` .. `custom_features_136` (one float
each, 0.0 where absent) and the graded label under `utility`. Where TF-Ranking writes the feature
spec by hand and runs a `SimplePipeline`, this program:
1. infers the spec from the training records (`infer_spec`, as `python -m tfapprox.data spec
   RECORDS --label utility` does; or reads --spec), with `transform: log1p` per feature under
   --use-log1p (TF-Ranking's `PreprocessorWithSpec` of sign(x)·log1p(|x|));
2. reads the records with `ranking_dataset(feature_spec=spec)`: features by name, the
   `example_list_mask`, labels [B, L] with -1 on padded documents (`SimpleDatasetBuilder`);
3. builds the scorer with `build_named_scorer(spec, hidden_units=...)`: the features side by
   side, then a `DNNScorer` (input batch norm, Dense → batch norm → ReLU → dropout blocks), as
   TF-Ranking's `ModelBuilder(FeatureSpecInputCreator, PreprocessorWithSpec, DNNScorer)`;
4. trains it with `model.fit` and a tfapprox loss, prints NDCG and MAP on the test records, saves
   model.keras and scores the test lists again with the reloaded model.
A numbers-only spec needs no lookup table, so this model also trains on JAX and under XLA.
"""

import argparse

import tensorflow as tf

from named_data import (add_named_flags, compile_for_ranking, feature_spec, fit_and_evaluate,
                        hidden_units, model_dir, named_splits, save_reload_and_score)
from tfapprox.data import ranking_dataset
from tfapprox.named_inputs import build_named_scorer


def binary_labels(features, labels):
    """Labels > 0 as 1, others kept (0, and padding -1): --convert-labels-to-binary."""
    return features, tf.where(labels > 0, 1.0, labels)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_named_flags(parser, "utility", num_lists=100, epochs=5)
    parser.add_argument("--list-size", type=int, help="truncate and pad training lists to this")
    parser.add_argument("--use-log1p", action="store_true",
                        help="sign(x)·log1p(|x|) on every feature")
    parser.add_argument("--convert-labels-to-binary", action="store_true")
    parser.add_argument("--batch-norm-moment", type=float, default=0.99)
    args = parser.parse_args()

    with named_splits(args, "numeric") as splits:
        spec = feature_spec(args, splits["train"],
                            **({"transform": "log1p"} if args.use_log1p else {}))
        print(f"spec: {len(spec.document)} document features, label {spec.label!r}")
        train = ranking_dataset(splits["train"], args.train_batch_size, list_size=args.list_size,
                                feature_spec=spec, shuffle=True, seed=0)
        vali, test = (ranking_dataset(splits[split], args.valid_batch_size, feature_spec=spec,
                                      shuffle=False) for split in ("vali", "test"))
        if args.convert_labels_to_binary:
            train, vali, test = (data.map(binary_labels) for data in (train, vali, test))

        model = build_named_scorer(spec, "B64", hidden_units=hidden_units(args),
                                   dropout=args.dropout, batch_norm_momentum=args.batch_norm_moment)
        compile_for_ranking(model, args)
        fit_and_evaluate(model, train, vali, test, args)
        with model_dir(args) as directory:
            save_reload_and_score(model, directory / "model.keras", test,
                                  lambda features: model(features, training=False))


if __name__ == "__main__":
    main()
