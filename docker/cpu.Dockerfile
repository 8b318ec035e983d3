# CPU image for x86_64 machines and aarch64 boards (the base is multi-arch): `pe-export parity` /
# `bench` on a mounted bundle, no TensorFlow. Where no registry is reachable, make a base with
# docker/local-base.sh and pass it: --build-arg BASE=pe-export-base:bookworm-arm64.
ARG BASE=python:3.11.9-slim-bookworm
FROM ${BASE}

RUN useradd --create-home --uid 1000 pe
COPY --chown=pe:pe . /opt/pe-export
RUN /opt/pe-export/docker/install-device.sh
ENV PATH=/opt/venv/bin:$PATH
COPY --chown=pe:pe docker/entrypoint.sh /usr/local/bin/pe-export-entrypoint
USER pe
WORKDIR /work
ENTRYPOINT ["/usr/local/bin/pe-export-entrypoint"]
CMD ["parity", "/work/model.tflite", "/work/golden"]
