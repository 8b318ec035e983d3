# Jetson AGX Orin, JetPack 6 (L4T r36.2, Python 3.10, CUDA 12.2, TensorRT 10):
# `pe-export parity` / `bench` on a mounted bundle, with no TensorFlow in the image.
FROM nvcr.io/nvidia/l4t-jetpack:r36.2.0

# onnxruntime-gpu for JetPack 6 comes from NVIDIA's Jetson wheel index (jp6/cu122), whose
# address is in NVIDIA's Jetson documentation; pass it at build time.
ARG JETSON_WHEEL_INDEX
RUN test -n "$JETSON_WHEEL_INDEX" || (echo "pass --build-arg JETSON_WHEEL_INDEX=<NVIDIA Jetson jp6/cu122 index>" && exit 1)

RUN apt-get update && apt-get install -y --no-install-recommends python3-pip python3-venv \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --create-home --uid 1000 pe
COPY --chown=pe:pe . /opt/pe-export
RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir '/opt/pe-export[device]' \
    && /opt/venv/bin/pip uninstall -y onnxruntime \
    && /opt/venv/bin/pip install --no-cache-dir --extra-index-url "$JETSON_WHEEL_INDEX" onnxruntime-gpu
ENV PATH=/opt/venv/bin:$PATH
COPY --chown=pe:pe docker/entrypoint.sh /usr/local/bin/pe-export-entrypoint
USER pe
WORKDIR /work
ENTRYPOINT ["/usr/local/bin/pe-export-entrypoint"]
CMD ["parity", "/work/model.onnx", "/work/golden", "--target", "jetson-agx-orin"]
