"""A Keras model trained with a tfapprox loss (ApproxNDCG) and metric (NDCG@5) in `model.fit`.

    python examples/keras_fit_letor.py                               # a generated set
    python examples/keras_fit_letor.py --data-dir MQ2008/Fold1 --epochs 20

Any Keras model that maps `{"features": [B, L, F], "mask": [B, L]}` to scores `[B, L]` works; here a
functional model scores each document with a small MLP. Lists keep their length (`list_size=None`:
each batch is padded to its longest list, padded slots carry label -1 and never reach the loss).
"""

import argparse

import keras

import tfapprox
from example_data import add_data_flags, letor_fold
from tfapprox.data import ranking_dataset


def mlp_scorer(num_features, hidden):
    """Returns a functional Keras model scoring every document of a list on its own features."""
    features = keras.Input(shape=(None, num_features), name="features")
    mask = keras.Input(shape=(None,), dtype="bool", name="mask")
    x = keras.layers.Dense(hidden, activation="relu")(features)
    scores = keras.ops.squeeze(keras.layers.Dense(1)(x), axis=-1)
    return keras.Model({"features": features, "mask": mask}, keras.ops.where(mask, scores, 0.0))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_flags(parser)
    parser.add_argument("--hidden", type=int, default=32, help="hidden units")
    args = parser.parse_args()

    with letor_fold(args) as fold:
        train = ranking_dataset(fold["train"], batch_size=args.batch_size, shuffle=True, seed=0)
        vali = ranking_dataset(fold["vali"], batch_size=args.batch_size, shuffle=False)
        test = ranking_dataset(fold["test"], batch_size=args.batch_size, shuffle=False)
        num_features = train.element_spec[0]["features"].shape[-1]

        model = mlp_scorer(num_features, args.hidden)
        model.compile(
            optimizer=keras.optimizers.Adam(1e-3),
            loss=tfapprox.losses.ApproxNDCGLoss(alpha=10.0),
            metrics=[tfapprox.metrics.NDCG(5), tfapprox.metrics.ApproxNDCGMetric(5)],
        )
        # shuffle=False: ranking_dataset already shuffles the lists, anew each epoch
        model.fit(train, validation_data=vali, epochs=args.epochs, shuffle=False, verbose=2)
        result = model.evaluate(test, verbose=0, return_dict=True)
    print(f"test NDCG@5 {result['ndcg@5']:.4f} (its smooth approximation {result['approx_ndcg@5']:.4f})")


if __name__ == "__main__":
    main()
