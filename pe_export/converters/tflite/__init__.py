"""TFLite: the converter's conversion, its graph rewrites, and the searches that edit its files."""
