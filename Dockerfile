# Quiver on a CUDA host, serving the packaged all-MiniLM-L6-v2 (not built in CI, which has no
# container engine; tests/ops/test_packaging.py checks that it installs what `make serve` installs).
#
#   docker build -t quiver .
#   docker run --gpus all -p 8080:8080 quiver                                  # every GPU of the host
#   docker run --gpus all -p 8080:8080 -v /srv/models:/models:ro quiver --model /models/bge-small-en-v1.5
#
# Arguments after the image name are `quiver serve` options. torch's CUDA wheels carry their own CUDA
# libraries; the base image brings the driver interface that the NVIDIA container toolkit mounts.
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}

ARG TORCH=torch==2.13.0
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HF_HUB_OFFLINE=1 \
    PATH=/opt/quiver/venv/bin:$PATH

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*

# torch first, from its CUDA index, in a layer of its own: it is most of the image and changes least.
RUN python3 -m venv /opt/quiver/venv \
    && pip install --no-cache-dir --index-url "${TORCH_INDEX}" "${TORCH}"

COPY . /src/quiver
RUN pip install --no-cache-dir /src/quiver

RUN useradd --system --create-home --home-dir /var/lib/quiver quiver
USER quiver
WORKDIR /var/lib/quiver

# HTTP, the broker's /metrics, and the workers' (9400 + N for worker N).
EXPOSE 8080 9300 9400-9407
ENTRYPOINT ["quiver", "serve", "--host", "0.0.0.0", "--metrics-host", "0.0.0.0"]
