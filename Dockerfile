# One image for the trainer and every sidecar; the command decides which runs.
#   docker build -t warden .                          (sidecars only, no torch)
#   docker build -t warden-train --build-arg WITH_TRAIN=true .
# No key, credential or policy secret is baked in: the signing key and S3 credentials
# arrive at run time as compose secrets / environment.
FROM python:3.11-slim

ARG WITH_TRAIN=false
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1

RUN useradd --create-home --uid 10001 warden
WORKDIR /opt/warden
COPY pyproject.toml README.md ./
COPY policies/locks/ policies/locks/
# The runtime comes from the project's own hashed lock (deps audits the same lock).
RUN if ls policies/locks/*.txt >/dev/null 2>&1; then \
      pip install --require-hashes -r "$(ls policies/locks/*.txt | head -n1)"; fi
COPY trainer/ trainer/
COPY sidecars/ sidecars/
COPY policies/ policies/
COPY alerts/ alerts/
RUN pip install --no-deps . \
 && if [ "$WITH_TRAIN" = "true" ]; then \
      pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0 \
      && pip install "transformers>=4.50" "tokenizers>=0.20" "safetensors>=0.4" "numpy>=1.26"; fi

USER warden
ENTRYPOINT ["warden"]
CMD ["--help"]
