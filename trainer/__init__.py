"""The tfapprox trainer: `python -m trainer [train|evaluate|export|cv]`.

config.py      the run configuration: presets, YAML/JSON files, dotted overrides from flags
data.py        LETOR folds / TFRecords / generated demo data -> tf.data, cached conversions
named_data.py  records with named features (--feature-spec): the spec, checks, lookups
train.py       one run: fit epoch by epoch, validation, selection, early stopping
build.py       a run's models from its configuration: the compiled scorer and its evaluation twin
metric_names.py  the metrics a run reports: selection metric, approximation monitor, gap
resume.py      taking up a run's checkpoint: same configuration, same data
report.py      results.json, summary and metric tables, TensorBoard scalars
export.py      the selected model as a TF Serving SavedModel; the export target's check
checkpoint.py  the per-epoch state file that makes a killed run resumable
run_lock.py    one trainer per run directory: the flock'd lock file naming its holder
distribute.py  --strategy default|mirrored|multi_worker and per-replica input
backend.py     --backend tensorflow|jax: chosen before Keras loads; devices; export from TensorFlow
cv.py          five-fold cross-validation with an optional hyperparameter grid
recipes.py     named ensembles (--recipe): members trained as runs, then one ensemble export
"""
