#!/bin/sh
# The Python layer every image shares: a venv with pe-export's device extra (numpy, click, onnx,
# onnxruntime, ai-edge-litert; never TensorFlow). Identical in every Dockerfile, so that one
# build's layer is reused by the next on the same base.
set -eu
python3 -m venv /opt/venv
/opt/venv/bin/pip install --no-cache-dir '/opt/pe-export[device]'
/opt/venv/bin/python -c 'import importlib.util, sys; sys.exit(importlib.util.find_spec("tensorflow") is not None)'
