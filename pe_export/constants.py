"""Defaults shared by the library API and the CLI, so the two cannot drift."""

from __future__ import annotations

DEFAULT_SIGNATURE = "serving_default"
DEFAULT_ONNX_OPSET = 17
# --quantize: the precisions and what each one is live in pe_export/precisions.py
MIN_ONNX_OPSET = 13  # tf2onnx and onnxruntime's quantizer both need 13+
MAX_ONNX_OPSET = 23  # the newest tf2onnx targets

# Inputs generated for the post-export check when the model's own shapes are dynamic.
VERIFY_BATCH = 2
VERIFY_SEQ_LEN = 16  # for dynamic-length models without a table read by position
# Dynamic-length models with position tables are checked (export verification, int8 calibration,
# golden bundles) over every row of their tables, up to this many positions.
MAX_CHECKED_POSITIONS = 512
VERIFY_SEED = 0
# Samples fed to the TFLite converter for full-integer calibration.
CALIBRATION_SAMPLES = 32
# Exports that choose by accuracy (int8: smoothing, calibration ranges, which weights stay float) choose on one
# part of the inputs and are judged on another the choices never saw: of --text / --inputs, every
# HOLDOUT_EVERY-th sample is held out (--holdout FILE gives them instead); generated inputs choose on their own
# seed, apart from the verification's.
HOLDOUT_EVERY = 4
CHOICE_SEED = 1000
# ONNX dynamic-int8: input channels per MatMul input split off the int8 product into a float one beside it
# (pe_export/converters/onnx/outliers.py), at most this many, each at least OUTLIER_RATIO times the median channel's
# peak.
# all-MiniLM-L6-v2, every weight int8, held-out worst pooled cosine by channels per input: 0 → 0.958, 1 → 0.9928,
# 2 → 0.9968, 4 → 0.9968, 8 → 0.9973 (2: 28 channels of 18 of its 25 MatMul inputs, +114 kB of float rows).
OUTLIER_CHANNELS = 2
# ONNX dynamic-int8's integer products (--int8-kernel): "rows" (the default), each row of a MatMul's input quantized
# by its own range (its step multiplies the row's products afterwards) into onnxruntime's integer GEMM
# (MatMulIntegerToFloat), inputs rotated by a block Hadamard where the simulation says it pays, weights rounded by
# GPTQ (pe_export/converters/onnx/row_int8.py), the weights its search keeps going float; "matmulinteger",
# quantize_dynamic's
# DynamicQuantizeLinear + MatMulInteger (standard ops, one activation range per tensor per call: the fastest
# product, the least accurate), the weights its search keeps going float; "blocks", every MatMul as onnxruntime's
# MatMulNBits (8-bit weights, activations quantized per block of 32 input channels of each row:
# pe_export/converters/onnx/block_int8.py); "mixed", matmulinteger with the weights the search keeps moved to blocks
# instead
# of float (float on top of all-blocks where that still misses).
ONNX_INT8_KERNELS = ("rows", "mixed", "matmulinteger", "blocks")
ONNX_INT8_KERNEL = "rows"
MAX_OUTLIER_CHANNELS = 64

# `pe-export bench` defaults.
BENCH_RUNS, BENCH_WARMUP, BENCH_BATCH, BENCH_SEQ_LEN = 100, 10, 1, 128
# Seconds a parity check's runtime may take for one call (loading included) before it is called hung.
DEFAULT_TIMEOUT_S = 120.0

TABLE_DTYPES = ("float32", "float16")  # storage precisions of position tables

# Bounds of the numeric options (errors.check_range): a value beyond them is a typo, not a model.
MAX_SEQ_LEN = 1 << 20
MAX_BATCH = 1 << 16
MAX_THREADS = 1024
MAX_SAMPLES = 1_000_000  # golden --samples
MAX_RUNS, MAX_WARMUP = 10_000_000, 1_000_000  # bench
MAX_COMPRESS = 1 << 16  # values stored per position

# Golden bundles.
GOLDEN_SAMPLES = 16
GOLDEN_BATCH = 4
GOLDEN_SEQ_LEN = 16  # for dynamic-length models without a table read by position
# golden --layers: the reference's activations a bundle may hold, all batches together (a BERT-base bundle of 16
# sentences at 128 tokens holds about 0.4 GB with --layers all, 25 MB with blocks).
MAX_LAYER_BYTES = 2 << 30
# TFLite's plain conversion runs in a child before the model is loaded (pe_export/converters/tflite/child.py) from this
# many
# bytes of weights: what it saves is the converter's importer's memory (3.7 GB at BERT-base), what it costs is a
# second TensorFlow import and load (a 260 kB encoder: 10.2 s exported through the child, 5.4 s in-process).
CHILD_CONVERSION_MIN_WEIGHT_BYTES = 32 * 2**20
