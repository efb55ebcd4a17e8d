"""TF-Ranking's antique_kpl_din.py on tfapprox: query and document tokens through a shared
embedding, a document interaction network (DIN) and a DNN.

    python examples/antique_kpl_din.py                       # generated records and vocab.txt
    python examples/antique_kpl_din.py --train-input-pattern train_elwc.tfrecord \\
        --valid-input-pattern eval_elwc.tfrecord --test-input-pattern test_elwc.tfrecord \\
        --vocab-file-path vocab.txt --model-dir /tmp/din

The records hold a context feature `query_tokens` and per document `document_tokens` (string
token lists) and the label `relevance` (int64). As TF-Ranking's program, the model looks each
token up in the vocabulary (one id for tokens outside it), embeds query and document tokens with
one shared table, averages each list of token embeddings, concatenates per document its query's
and its own (`ConcatFeatures`), runs `DocumentInteractionAttention` over the list and scores each
document with a DNN over all of it. In tfapprox's terms:
- the spec is inferred from the training records with the vocabulary for both token features
  (`infer_spec`, as `python -m tfapprox.data spec RECORDS --label relevance --vocabulary
  query_tokens=vocab.txt --vocabulary document_tokens=vocab.txt`), or read from --spec;
- `FeatureLookup(spec)` (StringLookup) maps tokens to ids in the tf.data pipeline, so the model
  after it trains compiled (`jit_compile=True`: XLA cannot compile lookup tables);
- `FeatureInputs(spec)` embeds and averages the tokens (one table for features that share a
  vocabulary file) and puts the query's embedding beside each document's, which is what
  TF-Ranking's embeddings + `ConcatFeatures` give the attention;
- the scorer adds `DocumentInteractionAttention`'s output to those features (`ConcatFeatures`)
  and ends in a `DNNScorer`;
- for saving, the lookup goes inside the model (`NamedFeatureScorer(..., lookup=lookup)`), so
  that model.keras scores raw string features, as TF-Ranking's exported model does.
"""

import argparse

import keras

from named_data import (add_named_flags, compile_for_ranking, feature_spec, fit_and_evaluate,
                        hidden_units, model_dir, named_splits, save_reload_and_score)
from tfapprox.data import ranking_dataset
from tfapprox.models import build_scorer
from tfapprox.named_inputs import (ConcatFeatures, DocumentInteractionAttention, FeatureInputs,
                                   FeatureLookup, NamedFeatureScorer)

TOKEN_FEATURES = ("query_tokens", "document_tokens")


def din_scorer(width, args):
    """Returns a Keras model `{"features": [B, L, width], "mask": [B, L]}` -> scores `[B, L]`:
    a `DNNScorer` over each document's features and, with --use-document-interaction, the
    `DocumentInteractionAttention` of its list beside them."""
    features = keras.Input(shape=(None, width), name="features")
    mask = keras.Input(shape=(None,), dtype="bool", name="mask")
    inputs = features
    if args.use_document_interaction:
        interaction = DocumentInteractionAttention(
            num_heads=args.num_attention_heads, head_size=args.head_size,
            num_layers=args.num_attention_layers, dropout=args.dropout)((features, mask))
        inputs = ConcatFeatures()(({}, {"document_interaction_embedding": interaction,
                                        "embeddings": features}, mask))
    dnn = build_scorer("B64", hidden_units=hidden_units(args), dropout=args.dropout,
                       batch_norm_momentum=args.batch_normalization_moment)
    scores = dnn({"features": inputs, "mask": mask})
    return keras.Model({"features": features, "mask": mask}, scores, name="din_scorer")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_named_flags(parser, "relevance", num_lists=100, epochs=5)
    parser.add_argument("--vocab-file-path", help="the tokens' vocabulary, one a line; default: "
                        "vocab.txt beside the records of --data-dir (or the generated one)")
    parser.add_argument("--list-size", type=int, default=50, help="training lists' size")
    parser.add_argument("--embedding-dimension", type=int, default=20)
    parser.add_argument("--batch-normalization-moment", type=float, default=0.99)
    parser.add_argument("--use-document-interaction", action=argparse.BooleanOptionalAction,
                        default=True)
    parser.add_argument("--num-attention-layers", type=int, default=1)
    parser.add_argument("--num-attention-heads", type=int, default=1)
    parser.add_argument("--head-size", type=int, default=128)
    parser.add_argument("--token-multiple", type=int, default=16,
                        help="pad token lists to a multiple of this (fewer compiled shapes)")
    args = parser.parse_args()

    with named_splits(args, "tokens") as splits:
        vocabulary = args.vocab_file_path or splits.get("vocabulary")
        if not vocabulary and not args.spec:
            raise SystemExit("error: the tokens need a vocabulary: give --vocab-file-path")
        spec = feature_spec(args, splits["train"], dict.fromkeys(TOKEN_FEATURES, vocabulary),
                            embedding_dim=args.embedding_dimension)
        lookup = FeatureLookup(spec, token_multiple=args.token_multiple)

        def looked_up(dataset):
            return dataset.map(lambda features, labels: (lookup(features), labels))

        train = ranking_dataset(splits["train"], args.train_batch_size, list_size=args.list_size,
                                feature_spec=spec, shuffle=True, seed=0)
        vali, test = (ranking_dataset(splits[split], args.valid_batch_size, feature_spec=spec,
                                      shuffle=False) for split in ("vali", "test"))

        inputs = FeatureInputs(spec, name="feature_inputs")
        model = NamedFeatureScorer(inputs, din_scorer(inputs.output_width, args))
        compile_for_ranking(model, args)
        fit_and_evaluate(model, looked_up(train), looked_up(vali), looked_up(test), args)

        serving = NamedFeatureScorer(model.feature_inputs, model.scorer, lookup=lookup)
        serving.build()  # of parts that are built already: it shares their weights
        with model_dir(args) as directory:
            save_reload_and_score(serving, directory / "model.keras", test,
                                  lambda features: model(lookup(features), training=False))


if __name__ == "__main__":
    main()
