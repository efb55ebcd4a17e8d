"""Scores lists with an exported ranker, as a client of the SavedModel (no tfapprox needed to load it).

    python examples/score_with_export.py /tmp/tfapprox-export-XXXX/approx_ap_b64/1

Two signatures are shown: `score_features` takes float32 features [batch, list, F] (pad short lists
with any finite values and ignore their scores); `serving_default` takes serialized
ExampleListWithContext protos, one per list, TF-Ranking's request format, and scores 0 on the
padding of shorter lists. The lists here are random features in [0, 1].
"""

import argparse

import numpy as np
import tensorflow as tf

from tfapprox.data.records import encode_elwc


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("version_dir", help="an export's version directory, <base>/<name>/<version>")
    parser.add_argument("--lengths", type=int, nargs="+", default=[5, 3], help="documents per list")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    loaded = tf.saved_model.load(args.version_dir)
    by_features = loaded.signatures["score_features"]
    by_elwc = loaded.signatures["serving_default"]
    num_features = by_features.structured_input_signature[1]["features"].shape[-1]  # (None, None, F)

    rng = np.random.default_rng(args.seed)
    lists = [rng.random((n, num_features), dtype=np.float32) for n in args.lengths]

    padded = np.zeros((len(lists), max(args.lengths), num_features), np.float32)
    for i, documents in enumerate(lists):
        padded[i, : len(documents)] = documents
    feature_scores = by_features(features=tf.constant(padded))["scores"].numpy()

    requests = tf.constant([encode_elwc(documents) for documents in lists])
    elwc_scores = by_elwc(elwc=requests)["scores"].numpy()

    for i, documents in enumerate(lists):
        n = len(documents)
        scores = elwc_scores[i, :n]
        order = np.argsort(-scores)
        shown = ", ".join(f"{score:.4f}" for score in scores)
        print(f"list {i}: scores [{shown}], ranking (best first) {order.tolist()}")
        if not np.allclose(scores, feature_scores[i, :n], atol=1e-5):
            raise SystemExit(f"list {i}: score_features and serving_default disagree")
    print("score_features and serving_default agree on every document")


if __name__ == "__main__":
    main()
