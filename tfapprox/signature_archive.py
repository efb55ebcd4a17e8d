"""A SavedModel of signatures over a Keras model, each signature traced once.

`SignatureArchive` has the part of `keras.export.ExportArchive`'s interface the export uses
(`track`, `add_endpoint`, `write_out`), but `write_out` lets `tf.saved_model.save` trace each
signature once, where ExportArchive first traces them all outside the save to list the variables
they read, and the save, whose functions are keyed by its own context, traces them all again.
Here the variables are those of the tracked models (a scorer reads no others), and the lookup
tables those of the Keras lookup layers within them.
"""

import keras
import tensorflow as tf


class SignatureArchive:
    """Signatures and what they read, written as one SavedModel by `write_out`."""

    def __init__(self):
        self._root = tf.Module()
        self._root.model_variables = []
        self._root.lookup_tables = []
        self._signatures = {}

    def track(self, layer):
        """Saves the variables of a Keras layer or model and the tables of its lookup layers."""
        if not layer.built:
            raise ValueError(f"{layer.name} is not built; build it before exporting it.")
        # The TensorFlow variables themselves (a Keras variable's `value` outside a layer's call),
        # which the signatures capture and the save must find tracked.
        self._root.model_variables.extend(variable.value for variable in layer.variables)
        for sublayer in layer._flatten_layers():  # StringLookup, IntegerLookup: `lookup_table`
            table = getattr(sublayer, "lookup_table", None)
            if table is not None and not any(table is known for known in self._root.lookup_tables):
                self._root.lookup_tables.append(table)

    def add_endpoint(self, name, function, input_signature):
        """Adds the signature `name`: `function` traced for `input_signature` (in the save)."""
        if name in self._signatures:
            raise ValueError(f"the signature {name!r} is already added")
        self._signatures[name] = tf.function(function, input_signature=input_signature,
                                             autograph=False)

    def write_out(self, directory):
        """Writes the SavedModel into `directory`."""
        tf.saved_model.save(self._root, str(directory), signatures=self._signatures)
