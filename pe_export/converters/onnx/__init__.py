"""ONNX: tf2onnx's conversion, its fixes and fusions, and each ONNX precision's step."""
