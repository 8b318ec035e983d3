# x86_64 + NVIDIA GPU (CUDA 12, cuDNN 9, TensorRT 10): parity and bench with the CUDA and
# TensorRT execution providers, no TensorFlow. The `python-layer` stage is the same on any
# Debian/Ubuntu base (tests build it on a local stand-in: --build-arg BASE=… --target python-layer).
ARG BASE=nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04
FROM ${BASE} AS python-layer

RUN apt-get update && apt-get install -y --no-install-recommends python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 1000 pe
COPY --chown=pe:pe . /opt/pe-export
RUN /opt/pe-export/docker/install-device.sh
ENV PATH=/opt/venv/bin:$PATH
COPY --chown=pe:pe docker/entrypoint.sh /usr/local/bin/pe-export-entrypoint
WORKDIR /work
USER pe
ENTRYPOINT ["/usr/local/bin/pe-export-entrypoint"]

FROM python-layer AS gpu
USER root
RUN apt-get update && apt-get install -y --no-install-recommends libnvinfer10 libnvinfer-plugin10 \
        libnvonnxparsers10 \
    && rm -rf /var/lib/apt/lists/*
RUN /opt/venv/bin/pip uninstall -y onnxruntime \
    && /opt/venv/bin/pip install --no-cache-dir 'onnxruntime-gpu>=1.20'
USER pe
ENTRYPOINT ["/usr/local/bin/pe-export-entrypoint"]
CMD ["parity", "/work/model.onnx", "/work/golden", "--target", "desktop-cuda"]
