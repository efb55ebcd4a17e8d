"""A custom training loop: `tf.GradientTape` on tfapprox's ApproxAP loss, exact MAP on validation.

    python examples/custom_training_loop.py                          # a generated set
    python examples/custom_training_loop.py --data-dir MQ2008/Fold1 --epochs 20

The loss is an ordinary callable `loss(labels, scores)`: labels [B, L] (-1 on padded slots), scores
[B, L]; it returns the mean over the lists that have a relevant document. The metrics are streaming
Keras metrics: `update_state(labels, scores)`, `result()`, `reset_state()`. TensorFlow backend.
"""

import argparse

import keras
import tensorflow as tf

import tfapprox
from example_data import add_data_flags, letor_fold
from tfapprox.data import ranking_dataset


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_flags(parser)
    parser.add_argument("--hidden", type=int, default=32, help="hidden units")
    args = parser.parse_args()

    loss_fn = tfapprox.losses.ApproxAPLoss(alpha=10.0, beta=10.0)
    exact_map = tfapprox.metrics.MeanAveragePrecision()
    smooth_map = tfapprox.metrics.ApproxAPMetric(alpha=10.0, beta=10.0)
    optimizer = keras.optimizers.Adam(1e-3)

    with letor_fold(args) as fold:
        train = ranking_dataset(fold["train"], batch_size=args.batch_size, shuffle=True, seed=0)
        vali = ranking_dataset(fold["vali"], batch_size=args.batch_size, shuffle=False)
        num_features = train.element_spec[0]["features"].shape[-1]
        # Dense layers act on the last axis, so this scores each document of [B, L, F] on its own.
        model = keras.Sequential([
            keras.Input(shape=(None, num_features)),
            keras.layers.Dense(args.hidden, activation="relu"),
            keras.layers.Dense(1),
        ])

        @tf.function(reduce_retracing=True)  # lists change length from batch to batch
        def train_step(features, labels):
            with tf.GradientTape() as tape:
                scores = tf.squeeze(model(features, training=True), axis=-1)
                loss = loss_fn(labels, scores)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss

        for epoch in range(1, args.epochs + 1):
            losses = [float(train_step(inputs["features"], labels)) for inputs, labels in train]
            exact_map.reset_state()
            smooth_map.reset_state()
            for inputs, labels in vali:
                scores = tf.squeeze(model(inputs["features"], training=False), axis=-1)
                exact_map.update_state(labels, scores)
                smooth_map.update_state(labels, scores)
            print(f"epoch {epoch}: train loss {sum(losses) / len(losses):.4f}, validation MAP "
                  f"{float(exact_map.result()):.4f} (ApproxAP {float(smooth_map.result()):.4f})")


if __name__ == "__main__":
    main()
