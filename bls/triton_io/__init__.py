"""The seam between Triton's Python backend and our plain-Python code.

Everything that touches `triton_python_backend_utils` objects goes through this package, so the logic modules deal
only in numpy arrays and dataclasses and are unit-tested without Triton. One module per job:

- `lock`: PB_LOCK, the one lock every pb_utils call of a process takes;
- `requests`: a request's inputs and parameters, a model's config parameters, the shipped-files check at load;
- `responses`: responses and errors (a Triton error code for every failure, never a traceback);
- `senders`: where a request's responses go: through the stub (StubSender), or as frames to the relay
  (RelayedSender: bls.relay.sending.FrameSender's frames, with a StubSender only to complete the child request);
- `children`: one-response calls to other models of the repository (BLS `exec`);
- `metrics`: custom Prometheus metrics, handed to Triton by one thread.
"""
