# syntax=docker/dockerfile:1
# Two targets from one distribution (docs/DEPLOY.md):
#   docker build --target service -t vrambudget-service:0.1.0 .   (service + trace tier, CPU torch)
#   docker build --target agent   -t vrambudget-agent:0.1.0 .     (GPU hosts: CUDA torch + nvidia-ml-py)
# Each target installs into a virtual environment in a build stage and copies only that
# environment into its runtime stage: no source tree, no pip cache, no build leftovers.
# Both run as the numeric user 10001:10001 (Kubernetes' runAsNonRoot can verify a number), with
# a read-only root filesystem in deploy/ (what each writes, and where: docs/DEPLOY.md).

FROM python:3.11-slim AS runtime
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PATH=/opt/venv/bin:$PATH
RUN groupadd --gid 10001 vrambudget \
    && useradd --uid 10001 --gid 10001 --create-home --home-dir /home/vrambudget vrambudget
WORKDIR /home/vrambudget

FROM python:3.11-slim AS source
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md requirements-lock.txt ./
COPY vrambudget ./vrambudget

FROM source AS build-service
# The trace tier runs on fake tensors: the CPU build of torch is enough (and far smaller). Both
# targets install the versions of requirements-lock.txt (scripts/lock), the ones the suite runs.
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --extra-index-url https://download.pytorch.org/whl/cpu \
       --constraint /src/requirements-lock.txt "/src[service,trace]"

FROM source AS build-agent
# The agent's probe children run the workload on the GPU: torch==2.13.0 (pinned by the extra)
# from PyPI, whose Linux x86_64 wheel is the CUDA build (its CUDA libraries come as pip
# packages); the driver (libcuda, libnvidia-ml) is mounted at run time by the NVIDIA Container
# Toolkit. To match another CUDA, add --index-url https://download.pytorch.org/whl/cuXYZ.
RUN python -m venv /opt/venv \
    && /opt/venv/bin/pip install --constraint /src/requirements-lock.txt "/src[agent]"

FROM runtime AS service
COPY --from=build-service /opt/venv /opt/venv
USER 10001:10001
ENV VRAMBUDGET_HOST=0.0.0.0 VRAMBUDGET_PORT=8000
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=3s CMD python -c "import urllib.request,os; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ['VRAMBUDGET_PORT'])"
CMD ["vrambudget", "serve"]

FROM runtime AS agent
COPY --from=build-agent /opt/venv /opt/venv
# The data directory exists in the image, owned by the agent's user, so that a new Docker
# volume mounted on it starts with that owner (Docker copies a mount point's ownership into an
# empty named volume); on Kubernetes an init container sets it on the host path.
RUN install -d -o 10001 -g 10001 -m 0700 /var/lib/vrambudget-agent
USER 10001:10001
EXPOSE 8100
# What the NVIDIA Container Toolkit mounts into the container: the CUDA driver (compute) and
# NVML / nvidia-smi (utility).
ENV VRAMBUDGET_AGENT_HOST=0.0.0.0 VRAMBUDGET_AGENT_DATA_DIR=/var/lib/vrambudget-agent \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
HEALTHCHECK --interval=30s --timeout=3s CMD python -c "import urllib.request,os; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('VRAMBUDGET_AGENT_PORT', '8100'))"
# Set VRAMBUDGET_AGENT_TOKENS (or _TOKEN_FILE) and VRAMBUDGET_AGENT_WEBHOOK_SECRET at run time.
CMD ["python", "-m", "vrambudget.agent"]
