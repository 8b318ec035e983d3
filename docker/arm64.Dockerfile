# Generic aarch64 CPU board: `pe-export parity` / `bench` on a mounted bundle, no TensorFlow.
FROM python:3.11.9-slim-bookworm

RUN useradd --create-home --uid 1000 pe
COPY --chown=pe:pe . /opt/pe-export
RUN python -m venv /opt/venv && /opt/venv/bin/pip install --no-cache-dir '/opt/pe-export[device]'
ENV PATH=/opt/venv/bin:$PATH
COPY --chown=pe:pe docker/entrypoint.sh /usr/local/bin/pe-export-entrypoint
USER pe
WORKDIR /work
ENTRYPOINT ["/usr/local/bin/pe-export-entrypoint"]
CMD ["parity", "/work/model.tflite", "/work/golden", "--target", "arm64"]
