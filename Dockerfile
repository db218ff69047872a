# syntax=docker/dockerfile:1
# Two targets from one distribution:
#   docker build --target service -t vrambudget-service .   (service + trace tier, CPU torch)
#   docker build --target agent   -t vrambudget-agent .     (GPU hosts: torch + nvidia-ml-py)

FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
RUN useradd --create-home --uid 10001 vrambudget
COPY pyproject.toml README.md ./
COPY vrambudget ./vrambudget

FROM base AS service
# The trace tier runs on fake tensors: the CPU build of torch is enough (and far smaller).
RUN pip install --extra-index-url https://download.pytorch.org/whl/cpu ".[service,trace]"
USER vrambudget
ENV VRAMBUDGET_HOST=0.0.0.0 VRAMBUDGET_PORT=8000
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=3s CMD python -c "import urllib.request,os; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ['VRAMBUDGET_PORT'])"
CMD ["vrambudget", "serve"]

FROM base AS agent
# torch==2.13.0 is pinned by the extra; on GPU hosts install the CUDA wheel of the same version.
RUN pip install ".[agent]"
USER vrambudget
EXPOSE 8100
ENV VRAMBUDGET_AGENT_HOST=0.0.0.0 VRAMBUDGET_AGENT_DATA_DIR=/home/vrambudget/agent-data
HEALTHCHECK --interval=30s --timeout=3s CMD python -c "import urllib.request,os; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('VRAMBUDGET_AGENT_PORT', '8100'))"
# Set VRAMBUDGET_AGENT_TOKENS (or _TOKEN_FILE) and VRAMBUDGET_AGENT_WEBHOOK_SECRET at run time.
CMD ["python", "-m", "vrambudget.agent"]
