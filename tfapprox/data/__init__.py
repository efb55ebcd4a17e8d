"""Ranking data: LETOR/SVMlight text, TFRecord lists (ELWC), and the tf.data pipeline."""
