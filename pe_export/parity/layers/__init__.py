"""Layer-wise parity: where an exported file first departs from the float32 reference.

``select`` finds the model's layer boundaries in its frozen graph (TF side), ``tap`` computes the reference's
activations there, ``mapping`` proves which tensor of an exported float32 file carries each layer (by values) and
stamps that map in the file, ``intermediates`` reads those tensors back from a runtime (TF-free), ``compare``
judges them layer by layer, and ``render`` writes the table, the plot and Model Explorer's node data.
"""
