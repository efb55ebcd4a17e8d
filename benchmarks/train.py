"""Training throughput of a B-net scorer with ApproxNDCG, and how much of a step waits on input.

    python benchmarks/train.py                        # B1024, list sizes 100 and 1000, batch 32
    python benchmarks/train.py --list-sizes 100 --steps 50 --preset B256 --jit
    python benchmarks/train.py --mixed-precision       # bfloat16 compute on CPU (float16 on GPU)

Data: MSLR-WEB30K-shaped lists generated here and written as ELWC TFRecord shards: 136 features,
graded labels 0-4 with MSLR's label shares, list lengths log-normal around 100 (mean ~120, as in
MSLR-WEB30K) clipped to 1..1251. Training reads them through `tfapprox.data.ranking_dataset`
(shuffled, repeated, cut or padded to the list size), exactly as the trainer does.

For each list size the script times `--steps` training steps after `--warmup` steps, twice:

* pipeline: each step first takes the next batch from the dataset iterator (the time blocked in
  `next()` is the input wait), then runs one optimizer step, synchronised by reading the loss;
* in-memory: the same steps on one batch already in memory, i.e. the step time without input.

Reported per list size: mean step time of both runs, valid documents per second and list slots
(documents + padding) per second of the pipeline run, and the input-wait share = time in `next()` /
pipeline wall time. The scorer's dense layers cost 6 FLOP per weight per document forward+backward
(≈ 5.0 MFLOP for B1024 on 136 features), padded slots included (the scorer computes them too), so
the in-memory step is also given as a share of this
machine's matmul FLOP/s in the compute dtype (`benchmarks/limits.py`, measured in the same run).
Figures depend on the machine; on a CPU-only host the tf.data threads compete
with the training step for the same cores, which inflates the input wait.
"""

import argparse
import os
import platform
import statistics
import tempfile
import time

import keras
import numpy as np

from tfapprox import losses, models
from tfapprox.data import dataset, records
from tfapprox.data.synthetic import mslr_lengths

NUM_FEATURES = 136
LABEL_SHARES = (0.514, 0.325, 0.134, 0.019, 0.008)  # MSLR-WEB30K, labels 0..4


def write_mslr_like(directory, num_lists, num_shards=8, seed=0):
    """Writes `num_lists` MSLR-shaped ELWC lists to `num_shards` TFRecord shards; returns #docs."""
    import tensorflow as tf

    rng = np.random.default_rng(seed)
    lengths = mslr_lengths(rng, num_lists)
    writers = [
        tf.io.TFRecordWriter(os.path.join(directory, f"part-{i:05d}-of-{num_shards:05d}.tfrecord"))
        for i in range(num_shards)
    ]
    weights = rng.normal(size=NUM_FEATURES).astype("float32")
    for i, length in enumerate(lengths.astype(int)):
        features = rng.normal(size=(length, NUM_FEATURES)).astype("float32")
        labels = rng.choice(len(LABEL_SHARES), size=length, p=LABEL_SHARES).astype("float32")
        features[:, :8] += labels[:, None] * weights[:8]  # learnable, like real relevance
        writers[i % num_shards].write(records.encode_elwc(features, labels, qid=i))
    for writer in writers:
        writer.close()
    return int(lengths.sum())


def _to_backend(batch):
    """tf.data yields TF tensors; other backends get numpy (counted as input time)."""
    if keras.backend.backend() == "tensorflow":
        return batch
    return keras.tree.map_structure(np.asarray, batch)


def _model(preset, jit):
    model = models.build_scorer(preset)
    model.compile(
        optimizer=keras.optimizers.Adagrad(0.05),
        loss=losses.ApproxNDCGLoss(),
        jit_compile=jit,
    )
    return model


def flop_per_document(model):
    """Returns 6 × the kernel weights of the scorer: FLOP per document, forward+backward.

    Self-attention's kernels count (its [units, heads, width] projections); its scores and
    weighted sums, 4·L·units FLOP per document and block forward, do not: the figure is a lower
    bound for DASALC, which grows with the list."""
    return 6 * sum(int(np.prod(w.shape)) for w in model.trainable_weights if len(w.shape) >= 2)


def bench_list_size(data_dir, list_size, batch_size, steps, warmup, preset, jit):
    """Returns the figures of one list size (see the module docstring)."""
    data = dataset.ranking_dataset(
        data_dir, batch_size, list_size=list_size, shuffle=True, seed=0, repeat=True,
        drop_remainder=True,
    )
    iterator = iter(data)
    model = _model(preset, jit)

    waits, totals, valid_docs = [], [], 0
    for step in range(warmup + steps):
        start = time.perf_counter()
        inputs, labels = _to_backend(next(iterator))
        got_batch = time.perf_counter()
        model.train_on_batch(inputs, labels)  # returns the loss as a number: synchronised
        done = time.perf_counter()
        if step >= warmup:
            waits.append(got_batch - start)
            totals.append(done - start)
            valid_docs += int(np.asarray(inputs["mask"]).sum())

    in_memory = []
    for step in range(warmup + steps):
        start = time.perf_counter()
        model.train_on_batch(inputs, labels)
        if step >= warmup:
            in_memory.append(time.perf_counter() - start)

    wall = sum(totals)
    step_in_memory = statistics.mean(in_memory)
    return {
        "flops_in_memory": flop_per_document(model) * batch_size * list_size / step_in_memory,
        "list_size": list_size,
        "batch_size": batch_size,
        "step_ms": 1e3 * statistics.mean(totals),
        "step_ms_in_memory": 1e3 * step_in_memory,
        "docs_per_s": valid_docs / wall,
        "slots_per_s": steps * batch_size * list_size / wall,
        "fill": valid_docs / (steps * batch_size * list_size),
        "input_wait": sum(waits) / wall,
    }


def _table(rows, matmul_limit):
    header = (
        "| list size | lists/batch | step ms | step ms (in memory) | valid docs/s | slots/s "
        "| valid share | input wait | in-memory GFLOP/s | share of matmul limit |"
    )
    lines = [header, "|---:" * 10 + "|"]
    for r in rows:
        lines.append(
            f"| {r['list_size']} | {r['batch_size']} | {r['step_ms']:.1f} | "
            f"{r['step_ms_in_memory']:.1f} | {r['docs_per_s']:,.0f} | {r['slots_per_s']:,.0f} | "
            f"{r['fill']:.0%} | {r['input_wait']:.1%} | {r['flops_in_memory'] / 1e9:.0f} | "
            f"{r['flops_in_memory'] / matmul_limit:.0%} |"
        )
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list-sizes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--batch-size", type=int, default=32, help="lists per step")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per list size")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps (tracing, autotune)")
    parser.add_argument("--preset", default="B1024", type=str.upper,
                        choices=sorted(models.PRESETS) + sorted(models.RECIPES))
    parser.add_argument("--lists", type=int, default=1024, help="generated lists")
    parser.add_argument("--data-dir", help="reuse/keep generated shards here (default: a temp dir)")
    parser.add_argument("--jit", action="store_true", help="XLA-compile the train step")
    parser.add_argument("--mixed-precision", action="store_true",
                        help="mixed_bfloat16 policy on CPU (mixed_float16 on GPU)")
    args = parser.parse_args(argv)

    import tensorflow as tf

    from limits import matmul_flops

    gpus = tf.config.list_physical_devices("GPU")
    compute_dtype = "float32"
    if args.mixed_precision:
        compute_dtype = "float16" if gpus else "bfloat16"
        keras.mixed_precision.set_dtype_policy(f"mixed_{compute_dtype}")

    with tempfile.TemporaryDirectory() as tmp:
        data_dir = args.data_dir or tmp
        os.makedirs(data_dir, exist_ok=True)
        if not any(name.endswith(".tfrecord") for name in os.listdir(data_dir)):
            start = time.perf_counter()
            num_docs = write_mslr_like(data_dir, args.lists)
            seconds = time.perf_counter() - start
            print(f"wrote {args.lists} lists, {num_docs} docs in {seconds:.1f}s")
        rows = [
            bench_list_size(
                data_dir, size, args.batch_size, args.steps, args.warmup, args.preset, args.jit
            )
            for size in args.list_sizes
        ]
    matmul_limit = matmul_flops(compute_dtype)
    print(
        f"\n{args.preset} + ApproxNDCG (Adagrad), backend {keras.backend.backend()}, "
        f"TF {tf.__version__}, {'GPU: ' + str(len(gpus)) if gpus else 'CPU only'}, "
        f"{os.cpu_count()} cores ({platform.processor() or platform.machine()}), "
        f"jit={args.jit}, compute {compute_dtype}, {args.steps} timed steps after "
        f"{args.warmup} warm-up; matmul limit ({compute_dtype}, benchmarks/limits.py): "
        f"{matmul_limit / 1e9:,.0f} GFLOP/s\n"
    )
    print(_table(rows, matmul_limit))


if __name__ == "__main__":
    main()
