"""Comparing an exported file's outputs with the float32 reference."""
