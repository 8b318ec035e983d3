"""Reference encoders built in code (TensorFlow side)."""
