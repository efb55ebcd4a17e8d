"""The deep batch-norm scorer (Bruch et al. 2019) trained on ApproxAP, then exported for TF Serving.

    python examples/deep_scorer_export.py                                  # exports to a temporary directory
    python examples/deep_scorer_export.py --export-dir saved_models --data-dir MQ2008/Fold1

`tfapprox.models.build_scorer("B64")` is a Keras model (batch-normalised input, Dense-BatchNorm-ReLU
blocks of 64, 32, 16 units, padded documents kept out of the batch statistics). The export is
`<export-dir>/<name>/<version>/`, the layout TF Serving watches; score it with score_with_export.py.
"""

import argparse
import tempfile

import keras

import tfapprox
from example_data import add_data_flags, letor_fold
from tfapprox.data import ranking_dataset
from tfapprox.export import export_saved_model
from tfapprox.models import build_scorer


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_data_flags(parser)
    parser.add_argument("--export-dir", help="base directory of the export (default: a new temporary "
                        "directory, kept so the export can be scored)")
    parser.add_argument("--name", default="approx_ap_b64", help="model name under --export-dir")
    args = parser.parse_args()

    with letor_fold(args) as fold:
        train = ranking_dataset(fold["train"], batch_size=args.batch_size, shuffle=True, seed=0)
        test = ranking_dataset(fold["test"], batch_size=args.batch_size, shuffle=False)
        num_features = train.element_spec[0]["features"].shape[-1]

        model = build_scorer("B64")
        model.compile(
            optimizer=keras.optimizers.Adagrad(0.05),
            loss=tfapprox.losses.ApproxAPLoss(alpha=10.0, beta=10.0),
            metrics=[tfapprox.metrics.MeanAveragePrecision(), tfapprox.metrics.NDCG(10)],
        )
        model.fit(train, epochs=args.epochs, shuffle=False, verbose=2)  # ranking_dataset shuffles
        result = model.evaluate(test, verbose=0, return_dict=True)
    print(f"test MAP {result['map']:.4f}, NDCG@10 {result['ndcg@10']:.4f}")

    export_dir = args.export_dir or tempfile.mkdtemp(prefix="tfapprox-export-")
    path = export_saved_model(model, export_dir, args.name, num_features=num_features)
    print(f"exported {path}")


if __name__ == "__main__":
    main()
