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
        self._tracked = []
        self._signatures = {}

    def track(self, obj):
        """Saves the variables of a Keras layer or model `obj` and the tables of its lookup layers."""
        if isinstance(obj, keras.layers.Layer):
            if not obj.built:
                raise ValueError(f"{obj.name} is not built; build it before exporting it.")
            # The TensorFlow variables themselves (a Keras variable's `value` outside a layer's
            # call), which the signatures capture and the save must find tracked.
            self._root.model_variables.extend(variable.value for variable in obj.variables)
        self._tracked.append(obj)

    def add_endpoint(self, name, function, input_signature):
        """Adds the signature `name`: `function` traced for `input_signature` (in the save)."""
        if name in self._signatures:
            raise ValueError(f"the signature {name!r} is already added")
        self._signatures[name] = tf.function(function, input_signature=input_signature,
                                             autograph=False)

    def write_out(self, directory, verbose=False):
        """Writes the SavedModel into `directory` (`verbose` is accepted for ExportArchive's sake
        and prints nothing)."""
        del verbose
        tables = []
        for obj in self._tracked:
            layers = obj._flatten_layers() if isinstance(obj, keras.layers.Layer) else ()
            for layer in layers:  # StringLookup and IntegerLookup hold theirs as `lookup_table`
                table = getattr(layer, "lookup_table", None)
                if table is not None and not any(table is known for known in tables):
                    tables.append(table)
        self._root.lookup_tables.extend(tables)
        tf.saved_model.save(self._root, str(directory), signatures=self._signatures)
