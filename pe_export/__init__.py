"""pe-export: export Transformer encoders with frozen position tables to TFLite and ONNX."""

__version__ = "0.1.0"
