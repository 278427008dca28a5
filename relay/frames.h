// The relay's frames: reading what the Python processes write, writing what the relay sends them. The layout is
// defined once, in relay/frames.md; tests/fixtures/relay_frames/ holds one frame of each kind, which both this
// code (relay/tests/frames_test.cc) and bls/relay/frames.py are tested against.
//
// Nothing here calls Triton: it only uses the C API's enums, so the test binary links without tritonserver.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "triton/core/tritonserver.h"

namespace llama3_relay {

// A frame claiming more is a broken or hostile connection, never a response. The largest legitimate frame is a
// response carrying context logits (vocabulary x 4 bytes x prompt length: 128256 x 4 x 2048 is 1 GiB).
constexpr uint32_t kMaxFrameBytes = 1u << 30;
constexpr uint32_t kHeaderBytes = 9;  // stream and kind, after the length
constexpr size_t kTokenBytes = 16;
constexpr uint8_t kMaxDims = 16;

enum FrameKind : uint8_t {
  kResponse = 0, kFinalResponse = 1, kError = 2, kClaim = 3, kCancelled = 4,
  kEngineRequest = 5, kEngineCancel = 6, kEngineResponse = 7, kEngineFinal = 8, kEngineError = 9,
};
constexpr uint8_t kLastKind = kEngineError;

// One tensor of a frame, its data at [data, data + length) of the frame's body.
struct FrameTensor {
  std::string name;
  TRITONSERVER_DataType datatype = TRITONSERVER_TYPE_INVALID;
  std::vector<int64_t> shape;
  size_t data = 0;
  uint64_t length = 0;
};

// A frame's body, read and checked whole: the fields its kind has.
struct Frame {
  uint64_t stream = 0;
  FrameKind kind = kResponse;
  std::vector<FrameTensor> tensors;  // kinds 0, 1, 5, 7, 8
  TRITONSERVER_Error_Code code = TRITONSERVER_ERROR_UNKNOWN;  // kinds 2, 9
  std::string message;  // kinds 2, 9
  std::string token;  // kind 3: kTokenBytes bytes
  std::string model;  // kind 5
  std::string request_id;  // kind 5
  std::vector<std::string> requested;  // kind 5: the outputs asked for
};

// Reads a frame's body (what follows its length) into `frame`; "" when it is a whole and valid frame of any kind,
// else what is wrong with it. Tensor offsets are into `body`.
std::string ParseFrame(const char* body, size_t size, Frame* frame);

// Splits the bytes a connection receives into frame bodies.
class FrameSplitter {
 public:
  enum Result { kFrame, kNeedMore, kOversized, kUndersized };
  void Append(const char* data, size_t size) { pending_.insert(pending_.end(), data, data + size); }
  // The next whole frame's body into `body` (kFrame); kNeedMore when it has not all come; kOversized or
  // kUndersized when its length is impossible (the connection is then unusable). `length` is the announced length.
  Result Next(std::vector<char>* body, uint32_t* length);
  // Forgets the bytes handed out by Next (called once per read, not per frame: one erase for many frames).
  void Compact();
  bool Empty() const { return pending_.size() == consumed_; }

 private:
  std::vector<char> pending_;
  size_t consumed_ = 0;
};

// Frames the relay writes, whole (length included).
std::vector<char> CancelledFrame(uint64_t stream);
std::vector<char> ErrorFrame(uint64_t stream, FrameKind kind, TRITONSERVER_Error_Code code, const std::string& message);

// Builds a tensor-carrying frame: Begin, one Add per tensor, Finish (which sets the count and the length).
class TensorFrameWriter {
 public:
  TensorFrameWriter(uint64_t stream, FrameKind kind);
  void Add(const char* name, TRITONSERVER_DataType datatype, const int64_t* shape, uint64_t dims, const void* data,
           uint64_t length);
  std::vector<char> Finish();

 private:
  std::vector<char> frame_;
  uint16_t count_ = 0;
};

// Bytes per element of a fixed-size datatype; 0 for BYTES and INVALID.
size_t ElementBytes(TRITONSERVER_DataType datatype);

}  // namespace llama3_relay
