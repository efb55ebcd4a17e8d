"""An ensemble of trained scorers that scores as one model: train, evaluate, save and export it.

    s(x) = 1/k Σ_m (s_m(x) − μ_m) / σ_m

`s_m` the scores of member m, `μ_m`, `σ_m` their mean and standard deviation over a set of
documents (`ScoreEnsemble.adapt`; the trainer's `ensemble` command uses the validation documents).
Standardising puts each member's scores, on a scale of its own (a softmax-trained scorer's logits
and a RankNet one's differ), on one, so the members weigh equally: DASALC-ens (Qin et al., ICLR
2021) averages seeds of one setting this way, and tfapprox's recipes mix settings.

μ_m and σ_m are constants, so a document's score does not depend on the other documents in the
request (unless a member's does: DASALC's self-attention), and every serving signature of
`tfapprox.export` scores it the same. `benchmarks.experiments` standardises each member within
each list instead; the two rules' NDCG@10 are compared in docs/benchmarks.md ("Quality").
"""

import keras
import numpy as np
from keras import ops

from tfapprox.models import split_inputs

__all__ = ["NonFiniteScores", "ScoreEnsemble"]


class NonFiniteScores(ValueError):
    """`ScoreEnsemble.adapt` found a member whose scores, or the constants fitted to them, are NaN
    or infinite: the ensemble would score every document NaN. `member` is its index; `reason`
    says what was found (the message, less the member's name)."""

    def __init__(self, member: int, name: str, reason: str):
        super().__init__(f"ScoreEnsemble member {member} ({name}) {reason}")
        self.member = member
        self.reason = reason


@keras.saving.register_keras_serializable(package="tfapprox")
class ScoreEnsemble(keras.Model):
    """Scores `[B, L]`: the mean of its members' scores, each standardised by constants.

    Args:
        members: The scorers, each taking `{"features": [B, L, F], "mask": [B, L]}` and
            returning `[B, L]` (or `[B, L, 1]`), e.g. trained `tfapprox.models.DNNScorer`s;
            or scorers over named features (`tfapprox.named_inputs.NamedFeatureScorer`), all
            over one feature spec, each taking the features by name with the mask under the
            spec's `mask_feature_name`, as the ensemble then does. They keep their weights;
            fitting the ensemble trains them together.

    `offsets` (μ_m) and `scales` (σ_m) are weights, 0 and 1 until `adapt` sets them; saved
    models, checkpoints and exports carry them. Padded slots score 0.
    """

    def __init__(self, members, **kwargs):
        super().__init__(**kwargs)
        members = list(members)
        if not members:
            raise ValueError("ScoreEnsemble needs at least one member; received none.")
        specs = {getattr(member, "spec", None) for member in members}
        specs = {spec if spec is None else spec.model_inputs() for spec in specs}
        if len(specs) > 1:
            raise ValueError("ScoreEnsemble members must take the same inputs: all the features "
                             "vector, or all one feature spec; received members over "
                             f"{len(specs)} different ones.")
        self.members = members
        self.offsets = self.add_weight(shape=(len(members),), initializer="zeros",
                                       trainable=False, name="offsets", autocast=False)
        self.scales = self.add_weight(shape=(len(members),), initializer="ones",
                                      trainable=False, name="scales", autocast=False)
        self.built = all(member.built for member in members)  # trained members: nothing to build

    @property
    def handles_missing(self) -> bool:
        """Whether NaN features are missing values to it: they are when they are to every member."""
        return all(getattr(member, "handles_missing", False) for member in self.members)

    def build(self, input_shape):
        for member in self.members:
            if not member.built:
                member.build(input_shape)

    @property
    def spec(self):
        """The feature spec of members over named features (None for vector features)."""
        return getattr(self.members[0], "spec", None)

    def _inputs_and_mask(self, inputs):
        """Returns what each member takes and the mask `[B, L]` of `inputs`."""
        if self.spec is None:
            features, mask = split_inputs(inputs)
            return {"features": features, "mask": mask}, mask
        return inputs, ops.cast(inputs[self.spec.mask_feature_name], "bool")

    def member_scores(self, inputs, training=False):
        """Returns each member's scores, stacked: `[B, L, k]`, float32."""
        given, mask = self._inputs_and_mask(inputs)
        shape = ops.shape(mask)
        return ops.stack([
            ops.reshape(ops.cast(member(given, training=training), "float32"), shape)
            for member in self.members
        ], axis=-1)

    def call(self, inputs, training=False):
        _, mask = self._inputs_and_mask(inputs)
        standardised = (self.member_scores(inputs, training) - self.offsets) / self.scales
        scores = ops.mean(standardised, axis=-1)
        return ops.where(mask, scores, ops.zeros_like(scores))

    def adapt(self, batches):
        """Sets `offsets` and `scales` to the mean and standard deviation of each member's scores
        over the real documents of `batches`: an iterable (a `tf.data.Dataset`, say) of inputs
        `{"features", "mask"}`, or of `(inputs, labels)` pairs. A member that gives every
        document one score gets scale 1 (it then adds 0 to every score). Returns the ensemble.

        Raises `NonFiniteScores`, leaving the constants as they were, if a member gives a real
        document a NaN or infinite score, or its μ or σ does not fit float32."""
        total = np.zeros(len(self.members))
        squares = np.zeros(len(self.members))
        not_finite = np.zeros(len(self.members), dtype=np.int64)
        count = 0
        for batch in batches:
            inputs = batch[0] if isinstance(batch, tuple) else batch
            _, mask = self._inputs_and_mask(inputs)
            scores = ops.convert_to_numpy(self.member_scores(inputs)).astype(np.float64)
            real = scores[ops.convert_to_numpy(mask)]
            finite = np.isfinite(real)
            not_finite += np.count_nonzero(~finite, axis=0)
            real = np.where(finite, real, 0.0)  # refused below; kept out of the sums meanwhile
            total += real.sum(axis=0)
            squares += np.square(real).sum(axis=0)
            count += len(real)
        if count == 0:
            raise ValueError("ScoreEnsemble.adapt received no documents: every slot was padding.")
        mean = total / count
        std = np.sqrt(np.maximum(squares / count - np.square(mean), 0.0))
        with np.errstate(over="ignore"):  # beyond float32's range: infinite, refused below
            offsets = mean.astype("float32")
            scales = np.where(std > 0, std, 1.0).astype("float32")
        for member, model in enumerate(self.members):
            if not_finite[member]:
                raise NonFiniteScores(member, model.name, f"scores {not_finite[member]} of {count} "
                                      "documents NaN or infinite")
            if not (np.isfinite(offsets[member]) and np.isfinite(scales[member])):
                raise NonFiniteScores(member, model.name, "has scores whose mean or standard "
                                      "deviation does not fit float32")
        self.offsets.assign(offsets)
        self.scales.assign(scales)
        return self

    def compute_output_shape(self, input_shape):
        if self.spec is not None:
            return tuple(input_shape[self.spec.mask_feature_name])
        feature_shape = input_shape["features"] if isinstance(input_shape, dict) else input_shape
        return tuple(feature_shape[:-1])

    def get_config(self):
        # a member's compile settings (a trainer compiles its scorer to evaluate it) are not the
        # ensemble's: a loaded ensemble compiles each member with no optimizer state to restore
        members = [{key: value for key, value in keras.saving.serialize_keras_object(m).items()
                    if key != "compile_config"} for m in self.members]
        return {**super().get_config(), "members": members}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        members = [keras.saving.deserialize_keras_object(m) for m in config.pop("members")]
        return cls(members, **config)
