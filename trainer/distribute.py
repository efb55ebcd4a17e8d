"""tf.distribute strategies for `--strategy default|mirrored|multi_worker`, and input distribution.

`multi_worker` reads the cluster from `TF_CONFIG` (JSON:
`{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": i}}`); every worker
runs the same command. Worker 0 (or the task of type "chief") is the chief: only it writes the
checkpoint, TensorBoard logs, results and the exported model; every worker reads the chief's
checkpoint when resuming. The strategy must be created before TensorFlow runs any op.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable

import tensorflow as tf

from trainer.checkpoint import CheckpointError


@dataclasses.dataclass
class Distribution:
    """A strategy and this process's place in it."""

    strategy: tf.distribute.Strategy
    name: str
    is_chief: bool
    worker_index: int
    num_workers: int

    @property
    def distributed(self) -> bool:
        return self.name != "default"

    @property
    def num_replicas(self) -> int:
        return self.strategy.num_replicas_in_sync

    def check_same(self, what: str, value: int) -> None:
        """Raises unless every worker holds the same `value` (e.g. the epoch it resumes from).

        Workers that disagree would wait on each other's collectives forever; this fails instead.
        """
        if self.name != "multi_worker":
            return
        gathered = self.strategy.gather(tf.constant([value], tf.int64), axis=0).numpy().tolist()
        if len(set(gathered)) > 1:
            raise CheckpointError(
                f"workers disagree on {what}: {gathered} (worker order). Every worker reads the "
                "chief's checkpoint, so --run-dir must be on a filesystem that all workers share."
            )

    def check_batch_size(self, global_batch_size: int) -> None:
        """Raises ValueError unless every replica gets the same number of lists per step."""
        if global_batch_size % self.num_replicas:
            raise ValueError(
                f"train.batch_size={global_batch_size} must be divisible by the number of replicas "
                f"({self.num_replicas}) under --strategy {self.name}"
            )

    def distribute(
        self, make_dataset: Callable[[int, int, int], tf.data.Dataset], global_batch_size: int
    ):
        """Returns the input for `fit`: a dataset, or a distributed one built per input pipeline.

        `make_dataset(batch_size, num_shards, shard_index)` must return batches of `batch_size`
        lists from shard `shard_index` of `num_shards`. Batches are split by replica: each replica
        gets `global_batch_size // num_replicas` lists.
        """
        if not self.distributed:
            return make_dataset(global_batch_size, 1, 0)
        self.check_batch_size(global_batch_size)

        def dataset_fn(context: tf.distribute.InputContext) -> tf.data.Dataset:
            return make_dataset(
                context.get_per_replica_batch_size(global_batch_size),
                context.num_input_pipelines,
                context.input_pipeline_id,
            )

        return self.strategy.distribute_datasets_from_function(dataset_fn)


def make(name: str) -> Distribution:
    """Returns the `Distribution` for a `--strategy` name; raises ValueError for a strategy that
    cannot run here (tf.distribute's on another Keras backend, `mirrored` on one device)."""
    import keras

    if name == "default":
        return Distribution(tf.distribute.get_strategy(), name, True, 0, 1)
    if keras.backend.backend() != "tensorflow":
        raise ValueError(f"--strategy {name} is tf.distribute's and needs --backend tensorflow; "
                         f"on {keras.backend.backend()} the trainer runs on one device")
    if name == "mirrored":
        gpus = tf.config.list_logical_devices("GPU")
        if len(gpus) < 2:
            raise ValueError(f"--strategy mirrored replicates over GPUs, and TensorFlow sees "
                             f"{len(gpus)}: use --strategy default on one device")
        return Distribution(tf.distribute.MirroredStrategy(), name, True, 0, 1)
    if name == "multi_worker":
        tf_config = _tf_config()
        cluster = tf_config.get("cluster", {})
        task = tf_config.get("task", {})
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=tf.distribute.experimental.CommunicationImplementation.RING
            )
        )
        _fix_keras_multi_worker_logs()
        task_type, index = task.get("type", "worker"), int(task.get("index", 0))
        is_chief = task_type == "chief" or (task_type == "worker" and index == 0 and "chief" not in cluster)
        num_workers = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
        return Distribution(strategy, name, is_chief, index, max(num_workers, 1))
    raise ValueError(f"--strategy must be default, mirrored or multi_worker, got {name!r}")


def _fix_keras_multi_worker_logs() -> None:
    """Makes Keras 3's `fit` average scalar logs across workers without failing.

    Under MultiWorkerMirroredStrategy Keras reduces every step output with
    `strategy.reduce("MEAN", value, axis=0)`, which raises "Invalid reduction dimension 0 for input
    with 0 dimensions" for the scalar loss and metric values (tensorflow/tensorflow#72388). Scalars
    are reduced with `axis=None` instead; everything else goes to Keras unchanged.
    """
    from keras.src.backend.tensorflow import trainer as keras_tf_trainer

    original = keras_tf_trainer.reduce_per_replica
    if getattr(original, "_tfapprox_fixed", False):
        return

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and keras_tf_trainer._collective_all_reduce_multi_worker(
            strategy
        ):
            return tf.nest.map_structure(
                lambda v: strategy.reduce("MEAN", v, axis=None if v.shape.rank == 0 else 0), values
            )
        return original(values, strategy, reduction)

    reduce_per_replica._tfapprox_fixed = True
    keras_tf_trainer.reduce_per_replica = reduce_per_replica


def _tf_config() -> dict:
    raw = os.environ.get("TF_CONFIG")
    if not raw:
        raise ValueError(
            "--strategy multi_worker reads the cluster from the TF_CONFIG environment variable, "
            'which is unset; e.g. TF_CONFIG=\'{"cluster": {"worker": ["10.0.0.1:12345", '
            '"10.0.0.2:12345"]}, "task": {"type": "worker", "index": 0}}\''
        )
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        raise ValueError(f"TF_CONFIG is not valid JSON ({err}): {raw!r}") from None
    if not isinstance(value, dict) or "cluster" not in value or "task" not in value:
        raise ValueError(f"TF_CONFIG must hold 'cluster' and 'task', got {raw!r}")
    return value
