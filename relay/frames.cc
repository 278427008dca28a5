// Reading and writing the relay's frames (relay/frames.md). The reader trusts nothing: every length is checked
// against what is left before it is used, every datatype, dimension, error code and data length against what
// it may be, and a body must be read to its last byte.
#include "frames.h"

#include <algorithm>
#include <cstring>

namespace llama3_relay {
namespace {

// The body being read: every Take checks that the bytes are there before it reads them.
class Reader {
 public:
  Reader(const char* data, size_t size) : data_(data), size_(size) {}

  template <typename T>
  bool Take(T* value) {
    if (size_ - at_ < sizeof(T)) return false;
    std::memcpy(value, data_ + at_, sizeof(T));
    at_ += sizeof(T);
    return true;
  }

  bool TakeString(std::string* value) {
    uint16_t length = 0;
    if (!Take(&length) || size_ - at_ < length) return false;
    value->assign(data_ + at_, length);
    at_ += length;
    return true;
  }

  // Skips `length` bytes; false when they are not there.
  bool Skip(uint64_t length) {
    if (size_ - at_ < length) return false;
    at_ += length;
    return true;
  }

  size_t at() const { return at_; }
  size_t left() const { return size_ - at_; }
  const char* data() const { return data_; }

 private:
  const char* data_;
  size_t size_;
  size_t at_ = 0;
};

// Whether BYTES data of `length` bytes holds exactly `elements` length-prefixed items.
bool WholeStrings(const char* data, uint64_t length, uint64_t elements) {
  uint64_t at = 0;
  for (uint64_t i = 0; i < elements; ++i) {
    uint32_t item = 0;
    if (length - at < sizeof(item)) return false;
    std::memcpy(&item, data + at, sizeof(item));
    at += sizeof(item);
    if (length - at < item) return false;
    at += item;
  }
  return at == length;
}

std::string TakeTensor(Reader* reader, FrameTensor* tensor) {
  uint8_t datatype = 0;
  uint8_t dims = 0;
  if (!reader->TakeString(&tensor->name)) return "a tensor's name is cut short";
  if (tensor->name.empty()) return "a tensor without a name";
  if (!reader->Take(&datatype) || !reader->Take(&dims)) return "tensor " + tensor->name + " is cut short";
  if (datatype <= TRITONSERVER_TYPE_INVALID || datatype > TRITONSERVER_TYPE_BF16) {
    return "tensor " + tensor->name + " has datatype " + std::to_string(datatype);
  }
  tensor->datatype = static_cast<TRITONSERVER_DataType>(datatype);
  if (dims > kMaxDims) return "tensor " + tensor->name + " has " + std::to_string(dims) + " dims";
  tensor->shape.resize(dims);
  uint64_t elements = 1;
  for (int64_t& dim : tensor->shape) {
    if (!reader->Take(&dim)) return "tensor " + tensor->name + " is cut short";
    if (dim < 0) return "tensor " + tensor->name + " has a negative dim";
    // Elements beyond the frame's size cannot be there: capping keeps the product from overflowing.
    elements = dim == 0 || elements == 0 ? 0 : std::min<uint64_t>(elements * std::min<uint64_t>(dim, kMaxFrameBytes),
                                                                    uint64_t{kMaxFrameBytes} + 1);
  }
  if (!reader->Take(&tensor->length)) return "tensor " + tensor->name + " is cut short";
  tensor->data = reader->at();
  if (!reader->Skip(tensor->length)) return "tensor " + tensor->name + "'s data is cut short";
  const size_t element = ElementBytes(tensor->datatype);
  if (element != 0 ? elements * element != tensor->length
                   : !WholeStrings(reader->data() + tensor->data, tensor->length, elements)) {
    return "tensor " + tensor->name + "'s data does not match its shape";
  }
  return "";
}

std::string TakeTensors(Reader* reader, std::vector<FrameTensor>* tensors) {
  uint16_t count = 0;
  if (!reader->Take(&count)) return "the tensor count is cut short";
  tensors->clear();  // grown as tensors are read: a count the frame cannot hold allocates nothing
  for (uint16_t i = 0; i < count; ++i) {
    tensors->emplace_back();
    std::string failure = TakeTensor(reader, &tensors->back());
    if (!failure.empty()) return failure;
  }
  return "";
}

template <typename T>
void Put(std::vector<char>* frame, T value) {
  const char* bytes = reinterpret_cast<const char*>(&value);
  frame->insert(frame->end(), bytes, bytes + sizeof(T));
}

std::vector<char> FrameStart(uint64_t stream, FrameKind kind) {
  std::vector<char> frame;
  Put<uint32_t>(&frame, 0);
  Put(&frame, stream);
  Put<uint8_t>(&frame, kind);
  return frame;
}

std::vector<char> FrameDone(std::vector<char> frame) {
  const uint32_t length = static_cast<uint32_t>(frame.size() - sizeof(uint32_t));
  std::memcpy(frame.data(), &length, sizeof(length));
  return frame;
}

}  // namespace

size_t ElementBytes(TRITONSERVER_DataType datatype) {
  switch (datatype) {
    case TRITONSERVER_TYPE_BOOL:
    case TRITONSERVER_TYPE_UINT8:
    case TRITONSERVER_TYPE_INT8:
      return 1;
    case TRITONSERVER_TYPE_UINT16:
    case TRITONSERVER_TYPE_INT16:
    case TRITONSERVER_TYPE_FP16:
    case TRITONSERVER_TYPE_BF16:
      return 2;
    case TRITONSERVER_TYPE_UINT32:
    case TRITONSERVER_TYPE_INT32:
    case TRITONSERVER_TYPE_FP32:
      return 4;
    case TRITONSERVER_TYPE_UINT64:
    case TRITONSERVER_TYPE_INT64:
    case TRITONSERVER_TYPE_FP64:
      return 8;
    default:
      return 0;
  }
}

std::string ParseFrame(const char* body, size_t size, Frame* frame) {
  Reader reader(body, size);
  uint8_t kind = 0;
  if (!reader.Take(&frame->stream) || !reader.Take(&kind)) return "a frame shorter than its header";
  if (kind > kLastKind) return "a frame of unknown kind " + std::to_string(kind);
  frame->kind = static_cast<FrameKind>(kind);
  std::string failure;
  switch (frame->kind) {
    case kResponse:
    case kFinalResponse:
    case kEngineResponse:
    case kEngineFinal:
      failure = TakeTensors(&reader, &frame->tensors);
      break;
    case kError:
    case kEngineError: {
      uint32_t code = 0;
      if (!reader.Take(&code)) return "an error frame without its code";
      if (code > TRITONSERVER_ERROR_CANCELLED) return "an error frame with code " + std::to_string(code);
      frame->code = static_cast<TRITONSERVER_Error_Code>(code);
      frame->message.assign(reader.data() + reader.at(), reader.left());
      reader.Skip(reader.left());
      break;
    }
    case kClaim:
      if (reader.left() != kTokenBytes) return "a claim without its " + std::to_string(kTokenBytes) + "-byte token";
      frame->token.assign(reader.data() + reader.at(), kTokenBytes);
      reader.Skip(kTokenBytes);
      break;
    case kEngineRequest: {
      uint16_t outputs = 0;
      if (!reader.TakeString(&frame->model) || !reader.TakeString(&frame->request_id) || !reader.Take(&outputs)) {
        return "an engine request cut short";
      }
      for (uint16_t i = 0; i < outputs; ++i) {
        frame->requested.emplace_back();
        if (!reader.TakeString(&frame->requested.back())) return "an engine request's outputs cut short";
      }
      failure = TakeTensors(&reader, &frame->tensors);
      break;
    }
    case kCancelled:
    case kEngineCancel:
      break;
  }
  if (!failure.empty()) return failure;
  if (reader.left() != 0) return "a frame of kind " + std::to_string(kind) + " with bytes after its end";
  return "";
}

FrameSplitter::Result FrameSplitter::Next(std::vector<char>* body, uint32_t* length) {
  if (pending_.size() - consumed_ < sizeof(uint32_t)) return kNeedMore;
  std::memcpy(length, pending_.data() + consumed_, sizeof(uint32_t));
  if (*length > kMaxFrameBytes) return kOversized;
  if (*length < kHeaderBytes) return kUndersized;
  if (pending_.size() - consumed_ - sizeof(uint32_t) < *length) return kNeedMore;
  const auto start = pending_.begin() + consumed_ + sizeof(uint32_t);
  body->assign(start, start + *length);
  consumed_ += sizeof(uint32_t) + *length;
  return kFrame;
}

void FrameSplitter::Compact() {
  pending_.erase(pending_.begin(), pending_.begin() + consumed_);
  consumed_ = 0;
}

std::vector<char> CancelledFrame(uint64_t stream) { return FrameDone(FrameStart(stream, kCancelled)); }

std::vector<char> ErrorFrame(uint64_t stream, FrameKind kind, TRITONSERVER_Error_Code code, const std::string& message) {
  std::vector<char> frame = FrameStart(stream, kind);
  Put<uint32_t>(&frame, code);
  frame.insert(frame.end(), message.begin(), message.end());
  return FrameDone(std::move(frame));
}

TensorFrameWriter::TensorFrameWriter(uint64_t stream, FrameKind kind) : frame_(FrameStart(stream, kind)) {
  Put<uint16_t>(&frame_, 0);  // the count, set by Finish
}

void TensorFrameWriter::Add(const char* name, TRITONSERVER_DataType datatype, const int64_t* shape, uint64_t dims,
                            const void* data, uint64_t length) {
  const size_t name_length = std::strlen(name);
  Put(&frame_, static_cast<uint16_t>(name_length));
  frame_.insert(frame_.end(), name, name + name_length);
  Put<uint8_t>(&frame_, datatype);
  Put<uint8_t>(&frame_, static_cast<uint8_t>(dims));
  for (uint64_t d = 0; d < dims; ++d) Put(&frame_, shape[d]);
  Put(&frame_, length);
  const char* bytes = static_cast<const char*>(data);
  if (length > 0) frame_.insert(frame_.end(), bytes, bytes + length);
  ++count_;
}

std::vector<char> TensorFrameWriter::Finish() {
  std::memcpy(frame_.data() + sizeof(uint32_t) + kHeaderBytes, &count_, sizeof(count_));
  return FrameDone(std::move(frame_));
}

}  // namespace llama3_relay
