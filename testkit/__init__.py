"""What tests/ and tools/ share to talk to and watch a running tritonserver: one HTTP/SSE client, one gRPC
stream helper, Prometheus metrics parsed by prometheus_client, server processes found with psutil, and
the statistics the benchmarks report."""
