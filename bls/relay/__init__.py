"""The Python half of the relay (relay/), one module per job: `frames` (the wire and the request parameters),
`connection` (a process's connection to a relay: claims, cancellations, engine calls), `engine_streams` (the BLS's
engine streams through it), `sending` (the threads that send the streamed responses, merging what waits) and
`admission` (the worker threads, bounded). A request that reached tensorrt_llm_bls through the relay has its
responses sent by the relay, inside tritonserver, and not by this process's stub.

The relay forwards the client's request to the Python model with three request parameters: the stream number
(STREAM_PARAMETER), the path of the Unix socket it listens on (SOCKET_PARAMETER, in a directory of its own, 0700)
and the stream's token (TOKEN_PARAMETER). The Python model claims the stream on its connection to that socket,
presenting the token, then writes each response of the request as one frame; the last frame is final (a final
response or an error), and only then does the Python model complete the child request itself. The frames are
laid out in relay/frames.md, the one definition both sides are tested against (tests/fixtures/relay_frames/).
A frame costs a few µs to encode and a share of one write, where a response sent through the stub is a
synchronous round trip to tritonserver (docs/benchmarks.md has both). The relay tells the claiming connection
when a stream's client cancels it, so that the model never asks Triton (a round trip each).

The relay closes a connection that sends anything it may not (relay/frames.md, Rules), which ends every stream
claimed on it. So this side never sends what it cannot vouch for: a request's relay parameters are checked
before anything is claimed (RelayedRequest.from_parameters: the socket is a relay's, in a directory of this
user's that nobody else can enter, and the token is the one the relay's key gives the stream; a client that
calls the Python model directly with made-up parameters is refused there), and frames of a stream that is not
claimed on the current connection are dropped (RelayConnection.write).

The same connection carries the process's engine calls (RelayEngineCall): the relay sends each as an in-process
request to the engine and writes its responses back as frames, which the connection's reader thread hands on, a
burst at a time.
"""
