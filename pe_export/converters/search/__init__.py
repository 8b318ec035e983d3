"""Searches both formats share: which weights stay float, smoothing, rotations."""
