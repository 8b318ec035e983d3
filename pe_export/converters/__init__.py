"""Converters from a SavedModel to TFLite and ONNX (installed as pe_export.converters)."""
