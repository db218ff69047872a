# syntax=docker/dockerfile:1
# Two targets from one distribution:
#   docker build --target service -t vrambudget-service .   (analytic service, no torch)
#   docker build --target agent   -t vrambudget-agent .     (GPU hosts: torch + nvidia-ml-py)

FROM python:3.11-slim AS base
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app
RUN useradd --create-home --uid 10001 vrambudget
COPY pyproject.toml README.md ./
COPY service ./service
COPY agent ./agent

FROM base AS service
RUN pip install ".[service]"
USER vrambudget
ENV VRAMBUDGET_HOST=0.0.0.0 VRAMBUDGET_PORT=8000
EXPOSE 8000
HEALTHCHECK --interval=30s --timeout=3s CMD python -c "import urllib.request,os; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ['VRAMBUDGET_PORT'])"
CMD ["vrambudget", "serve"]

FROM base AS agent
# torch==2.13.0 is pinned by the extra; on GPU hosts install the CUDA wheel of the same version.
RUN pip install ".[agent]"
USER vrambudget
ENV VRAMBUDGET_HOST=0.0.0.0 VRAMBUDGET_PORT=8100
EXPOSE 8100
# The probe agent (`vrambudget agent`) is not built yet; this target carries its dependencies.
CMD ["python", "-c", "raise SystemExit('vrambudget agent: not built yet')"]
