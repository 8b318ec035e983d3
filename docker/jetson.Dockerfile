# Jetson AGX Orin, JetPack 6 (L4T r36.2, Python 3.10, CUDA 12.2, TensorRT 10):
# `pe-export parity` / `bench` on a mounted bundle, with no TensorFlow in the image. The
# `python-layer` stage is the same on any Debian/Ubuntu base (tests build it on a local stand-in).
ARG BASE=nvcr.io/nvidia/l4t-jetpack:r36.2.0
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

# onnxruntime-gpu for JetPack 6 comes from NVIDIA's Jetson wheel index (jp6/cu122), whose
# address is in NVIDIA's Jetson documentation; pass it at build time.
FROM python-layer AS gpu
ARG JETSON_WHEEL_INDEX
USER root
RUN test -n "$JETSON_WHEEL_INDEX" || (echo "pass --build-arg JETSON_WHEEL_INDEX=<NVIDIA Jetson jp6/cu122 index>" && exit 1)
RUN /opt/venv/bin/pip uninstall -y onnxruntime \
    && /opt/venv/bin/pip install --no-cache-dir --extra-index-url "$JETSON_WHEEL_INDEX" onnxruntime-gpu
USER pe
ENTRYPOINT ["/usr/local/bin/pe-export-entrypoint"]
CMD ["parity", "/work/model.onnx", "/work/golden", "--target", "jetson-agx-orin"]
