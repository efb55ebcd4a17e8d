"""docs/migrating.md has a row for every TF-Ranking Keras metric class, naming a tfapprox class
that exists (the list of TF-Ranking's classes is checked against TF-Ranking itself by
test_parity_tfranking.py)."""

import re

from conftest import REPO
from tfapprox import metrics

# tfr.keras.metrics' metric classes in TF-Ranking 0.5.5
TFR_KERAS_METRICS = (
    "MRRMetric", "HitsMetric", "ARPMetric", "PrecisionMetric", "RecallMetric",
    "PrecisionIAMetric", "MeanAveragePrecisionMetric", "NDCGMetric", "DCGMetric",
    "AlphaDCGMetric", "OPAMetric",
)


def metrics_rows():
    """Returns {TF-Ranking class: tfapprox class} from the table of the guide's Metrics section."""
    text = (REPO / "docs" / "migrating.md").read_text(encoding="utf-8")
    section = text.split("\n## Metrics\n", 1)[1].split("\n## ", 1)[0]
    return dict(re.findall(r"^\| `(\w+)\(.*?\)` \| `(\w+)\(", section, flags=re.MULTILINE))


def test_every_tfranking_keras_metric_has_a_row_naming_a_tfapprox_metric():
    rows = metrics_rows()
    assert sorted(rows) == sorted(TFR_KERAS_METRICS)
    for theirs, ours in rows.items():
        assert isinstance(getattr(metrics, ours, None), type), (theirs, ours)
