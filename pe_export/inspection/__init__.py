"""Reading exported files without running them: .tflite and .onnx need no TensorFlow."""
