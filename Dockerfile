# One image for the trainer and every sidecar; the command decides which runs.
#   docker build -t warden:0.1.0 .                                 (sidecars only, no torch)
#   docker build -t warden-train:0.1.0 --build-arg WITH_TRAIN=true .
# scripts/compose-stack builds both (and the other images docker-compose.yml names) with
# podman, mounting this machine's pip configuration, wheel mirror and CA bundle into the
# RUN steps; nothing of them is copied into an image.
# No key, credential or policy secret is baked in: the signing key and S3 credentials
# arrive at run time as compose secrets / environment.
ARG BASE_IMAGE=docker.io/library/debian:12.15-slim

# ---- Debian's Python 3.11 in a venv, the service user and every mount point -------------------
FROM ${BASE_IMAGE} AS python
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1 \
    VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
# The environment deps audits is /opt/venv/lib/python3.11/site-packages.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/venv
# Mount points created and owned here: Docker copies an image directory's owner into a new
# named volume (podman also chowns), so uid 10001 can write them.
RUN useradd --create-home --uid 10001 --user-group warden \
 && mkdir -p /run/warden /models /data /var/lib/warden/archiver /var/lib/warden/tokenscan \
      /var/lib/warden/deps /var/lib/warden/paths /var/lib/warden/journal /var/lib/warden/osv /var/lib/warden/webhook \
      /run/warden-key \
 && chown warden:warden /run/warden /models /data /var/lib/warden/archiver /var/lib/warden/tokenscan \
      /var/lib/warden/deps /var/lib/warden/paths /var/lib/warden/journal /var/lib/warden/osv /var/lib/warden/webhook \
 && chmod 0700 /run/warden-key

# ---- the train extra's requirements (pyproject.toml's pins) as a file: its content, not every
# edit of pyproject.toml, decides whether the heavy layers below are rebuilt -----------------------
FROM python AS train-requirements
COPY pyproject.toml /tmp/pyproject.toml
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('/tmp/pyproject.toml', 'rb'))['project']['optional-dependencies']['train']))" > /tmp/train.txt

FROM python
# pip settings for the RUN steps only (build arguments are not kept in the image's environment).
ARG PIP_INDEX_URL
ARG PIP_EXTRA_INDEX_URL
ARG PIP_FIND_LINKS
ARG PIP_TRUSTED_HOST
ARG PIP_CERT
ARG PIP_CONSTRAINT
ARG PIP_DEFAULT_TIMEOUT
ARG PIP_DISABLE_PIP_VERSION_CHECK
WORKDIR /opt/warden
# The runtime comes from the project's own hashed lock (deps audits the same lock); the lock is
# complete, so no dependency is resolved (a newer release upstream cannot enter the image).
COPY policies/locks/runtime-py311-linux-x86_64.txt /tmp/runtime-lock.txt
RUN pip install --no-deps --require-hashes -r /tmp/runtime-lock.txt && rm /tmp/runtime-lock.txt

ARG WITH_TRAIN=false
# The CPU build of torch comes from this index; empty: from pip's own configuration
# (an index or a --find-links wheel directory that holds torch==2.13.0+cpu).
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
COPY --from=train-requirements /tmp/train.txt /tmp/train.txt
RUN if [ "$WITH_TRAIN" = "true" ]; then \
      if [ -n "$TORCH_INDEX_URL" ]; then set -- --extra-index-url "$TORCH_INDEX_URL"; fi \
      && pip install "$@" -r /tmp/train.txt \
      && python -c "import torch, sys; sys.exit('torch is not the CPU build: ' + str(torch.version.cuda)) if torch.version.cuda else print('torch', torch.__version__)"; \
    fi \
 && rm /tmp/train.txt

# The project (packages, policies, alerts, stack/): what .dockerignore leaves of the checkout.
COPY . ./
RUN pip install --no-deps . \
 && python stack/derive-policy.py policies/deps.yaml policies/deps.compose.yaml \
      "  osv_db: null" "  osv_db: /var/lib/warden/osv"

USER warden
ENTRYPOINT ["warden"]
CMD ["--help"]
