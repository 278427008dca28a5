"""An OpenAI-compatible HTTP API in front of a tritonserver serving this repository (docs/openai.md).

Its own process: FastAPI + uvicorn, talking to `tensorrt_llm_bls` over gRPC streams (tritonclient's asyncio
client). `python -m openai_api --triton-grpc HOST:PORT` starts it.
"""
