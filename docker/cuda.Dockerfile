# x86_64 + NVIDIA GPU (CUDA 12, cuDNN 9, TensorRT 10): parity and bench with the CUDA and
# TensorRT execution providers, no TensorFlow.
FROM nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04

RUN apt-get update && apt-get install -y --no-install-recommends python3-pip python3-venv libnvinfer10 \
        libnvinfer-plugin10 libnvonnxparsers10 \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 1000 pe
COPY --chown=pe:pe . /opt/pe-export
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir '/opt/pe-export[device]' \
    && /opt/venv/bin/pip uninstall -y onnxruntime \
    && /opt/venv/bin/pip install --no-cache-dir 'onnxruntime-gpu>=1.20'
ENV PATH=/opt/venv/bin:$PATH
COPY --chown=pe:pe docker/entrypoint.sh /usr/local/bin/pe-export-entrypoint
USER pe
WORKDIR /work
ENTRYPOINT ["/usr/local/bin/pe-export-entrypoint"]
CMD ["parity", "/work/model.onnx", "/work/golden", "--target", "desktop-cuda"]
