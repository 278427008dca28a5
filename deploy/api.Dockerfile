# The OpenAI-compatible API (python -m openai_api) as an image: the Kubernetes Deployment's `openai-api` sidecar
# (deploy/values.yaml `api.image`). Build from the repository root: `make api-image` (docs/operations.md, "Kubernetes").
#
# Only the API: its pins from pyproject.toml (deploy/api_requirements.py: the `api` extra and the core pins it
# imports, numpy and protobuf; no transformers, no torch) and the two packages it imports, openai_api and bls.
# It reads nothing of the model repository but repository.json (the model's name, `--repo`), from the pod's volume.
FROM python:3.12.12-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/llama3-triton
COPY pyproject.toml deploy/api_requirements.py ./
RUN python3 api_requirements.py pyproject.toml > requirements-api.txt \
    && pip install --no-cache-dir -r requirements-api.txt \
    && rm api_requirements.py pyproject.toml
COPY bls/ bls/
COPY openai_api/ openai_api/
ENV PYTHONPATH=/opt/llama3-triton

# Not root: the API needs no privilege (port 9000, a read-only repository, the key file of a Secret volume, which is
# root's and 0644 unless the volume's defaultMode says otherwise: this uid reads it as "others").
RUN useradd --system --uid 10001 --no-create-home --shell /usr/sbin/nologin api
USER 10001
EXPOSE 9000

# deploy/render.py's API_ENTRYPOINT; the Deployment's `command` gives the whole argv (its Triton, port, model name,
# repository, key file). `docker run IMAGE --triton-grpc HOST:8001 --host 0.0.0.0` runs it anywhere else.
ENTRYPOINT ["python3", "-m", "openai_api"]
CMD ["--help"]
