// The relay's frame code against the golden frames (tests/fixtures/relay_frames/, one per kind; bls/relay/frames.py is
// tested against the same bytes): every kind read as relay/frames.md lays it out, the kinds the relay writes
// written byte for byte, the stream token as Python's hmac computes it, and hostile input (every truncation,
// trailing bytes, impossible fields and lengths, random bytes, mutated frames) refused without a crash.
// tests/unit/test_relay_cpp.py compiles it with sanitizers and runs it: frames_test <fixture dir>.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "check.h"
#include "../frames.h"
#include "../token.h"

using namespace llama3_relay;

namespace {

std::string fixtures;

// A fixture's bytes: hex digits, '#' comments to the end of the line, whitespace ignored.
std::vector<char> Fixture(const std::string& name) {
  std::ifstream file(fixtures + "/" + name);
  if (!file) {
    std::fprintf(stderr, "cannot read %s/%s\n", fixtures.c_str(), name.c_str());
    std::exit(2);
  }
  std::vector<char> bytes;
  std::string line;
  while (std::getline(file, line)) {
    line = line.substr(0, line.find('#'));
    std::string digits;
    for (char c : line) {
      if (!std::isspace(static_cast<unsigned char>(c))) digits += c;
    }
    for (size_t i = 0; i + 1 < digits.size(); i += 2) {
      bytes.push_back(static_cast<char>(std::stoi(digits.substr(i, 2), nullptr, 16)));
    }
  }
  return bytes;
}

std::string Hex(const std::string& bytes) {
  std::string hex;
  char digits[3];
  for (unsigned char byte : bytes) {
    std::snprintf(digits, sizeof(digits), "%02x", byte);
    hex += digits;
  }
  return hex;
}

// The frame's body (after its length) parsed; the length checked against the bytes.
Frame Parse(const std::vector<char>& whole) {
  uint32_t length = 0;
  std::memcpy(&length, whole.data(), 4);
  CHECK(length == whole.size() - 4);
  Frame frame;
  const std::string failure = ParseFrame(whole.data() + 4, whole.size() - 4, &frame);
  if (!failure.empty()) std::fprintf(stderr, "unexpected parse failure: %s\n", failure.c_str());
  CHECK(failure.empty());
  return frame;
}

template <typename T>
T Value(const std::vector<char>& whole, const FrameTensor& tensor, size_t index = 0) {
  T value;
  std::memcpy(&value, whole.data() + 4 + tensor.data + index * sizeof(T), sizeof(T));
  return value;
}

std::string Data(const std::vector<char>& whole, const FrameTensor& tensor) {
  return std::string(whole.data() + 4 + tensor.data, tensor.length);
}

void TestEveryKindReads() {
  std::vector<char> bytes = Fixture("0_response.hex");
  Frame frame = Parse(bytes);
  CHECK(frame.stream == 42 && frame.kind == kResponse && frame.tensors.size() == 2);
  CHECK(frame.tensors[0].name == "text_output" && frame.tensors[0].datatype == TRITONSERVER_TYPE_BYTES);
  CHECK(frame.tensors[0].shape == std::vector<int64_t>({2}));
  CHECK(Data(bytes, frame.tensors[0]) == std::string("\x03\0\0\0h\xc3\xa9\0\0\0\0", 11));
  CHECK(frame.tensors[1].name == "num_output_tokens" && frame.tensors[1].datatype == TRITONSERVER_TYPE_INT32);
  CHECK(frame.tensors[1].shape == std::vector<int64_t>({1, 1}) && Value<int32_t>(bytes, frame.tensors[1]) == 7);

  frame = Parse(Fixture("1_final_response.hex"));
  CHECK(frame.stream == 42 && frame.kind == kFinalResponse && frame.tensors.empty());

  frame = Parse(Fixture("2_error.hex"));
  CHECK(frame.stream == 9 && frame.kind == kError && frame.code == TRITONSERVER_ERROR_INVALID_ARG);
  CHECK(frame.message == "max_tokens: is required");

  frame = Parse(Fixture("3_claim.hex"));
  std::string key;
  for (int i = 0; i < 32; ++i) key += static_cast<char>(i);
  CHECK(frame.stream == 7 && frame.kind == kClaim && frame.token == StreamToken(key, 7));

  frame = Parse(Fixture("4_cancelled.hex"));
  CHECK(frame.stream == 7 && frame.kind == kCancelled);

  bytes = Fixture("5_engine_request.hex");
  frame = Parse(bytes);
  CHECK(frame.stream == 5 && frame.kind == kEngineRequest && frame.model == "tensorrt_llm");
  CHECK(frame.request_id == "req-1" && frame.requested == std::vector<std::string>({"output_ids"}));
  CHECK(frame.tensors.size() == 2 && frame.tensors[0].name == "input_ids");
  CHECK(frame.tensors[0].shape == std::vector<int64_t>({1, 2}) && Value<int32_t>(bytes, frame.tensors[0], 1) == 2);
  CHECK(frame.tensors[1].name == "streaming" && frame.tensors[1].datatype == TRITONSERVER_TYPE_BOOL);
  CHECK(Data(bytes, frame.tensors[1]) == "\x01");

  frame = Parse(Fixture("6_engine_cancel.hex"));
  CHECK(frame.stream == 5 && frame.kind == kEngineCancel);

  bytes = Fixture("7_engine_response.hex");
  frame = Parse(bytes);
  CHECK(frame.stream == 5 && frame.kind == kEngineResponse && frame.tensors.size() == 2);
  CHECK(frame.tensors[0].shape == std::vector<int64_t>({1, 1, 1}) && Value<int32_t>(bytes, frame.tensors[0]) == 7);
  CHECK(frame.tensors[1].name == "sequence_length" && Value<int32_t>(bytes, frame.tensors[1]) == 3);

  frame = Parse(Fixture("8_engine_final.hex"));
  CHECK(frame.kind == kEngineFinal && frame.tensors.size() == 1 && frame.tensors[0].length == 0);
  CHECK(frame.tensors[0].shape == std::vector<int64_t>({1, 1, 0}));

  frame = Parse(Fixture("9_engine_error.hex"));
  CHECK(frame.kind == kEngineError && frame.code == TRITONSERVER_ERROR_UNAVAILABLE);
  CHECK(frame.message == "tensorrt_llm: queue full");
}

void TestTheRelaysFramesAreWrittenAsTheFixtures() {
  CHECK(CancelledFrame(7) == Fixture("4_cancelled.hex"));
  CHECK(ErrorFrame(5, kEngineError, TRITONSERVER_ERROR_UNAVAILABLE, "tensorrt_llm: queue full") ==
        Fixture("9_engine_error.hex"));
  const int64_t shape3[] = {1, 1, 1};
  const int64_t shape2[] = {1, 1};
  const int32_t seven = 7;
  const int32_t three = 3;
  TensorFrameWriter response(5, kEngineResponse);
  response.Add("output_ids", TRITONSERVER_TYPE_INT32, shape3, 3, &seven, 4);
  response.Add("sequence_length", TRITONSERVER_TYPE_INT32, shape2, 2, &three, 4);
  CHECK(response.Finish() == Fixture("7_engine_response.hex"));
  const int64_t empty[] = {1, 1, 0};
  TensorFrameWriter final(5, kEngineFinal);
  final.Add("output_ids", TRITONSERVER_TYPE_INT32, empty, 3, nullptr, 0);
  CHECK(final.Finish() == Fixture("8_engine_final.hex"));
}

void TestHashes() {
  // FIPS 180-4's "abc", and RFC 4231's test case 2.
  CHECK(Hex(Sha256("abc")) == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(Hex(Sha256(std::string(1000, 'a'))) == "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
  CHECK(Hex(HmacSha256("Jefe", "what do ya want for nothing?")) ==
        "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

bool Parses(const std::vector<char>& body) {
  Frame frame;
  return ParseFrame(body.data(), body.size(), &frame).empty();
}

std::vector<char> Body(const std::string& fixture) {
  std::vector<char> whole = Fixture(fixture);
  return std::vector<char>(whole.begin() + 4, whole.end());
}

void TestTruncatedAndTrailingBytesAreRefused() {
  for (const char* name : {"0_response.hex", "1_final_response.hex", "2_error.hex", "3_claim.hex", "4_cancelled.hex",
                           "5_engine_request.hex", "6_engine_cancel.hex", "7_engine_response.hex",
                           "8_engine_final.hex", "9_engine_error.hex"}) {
    const std::vector<char> body = Body(name);
    const bool message_is_the_rest = body[8] == kError || body[8] == kEngineError;
    for (size_t cut = 0; cut < body.size(); ++cut) {
      const std::vector<char> part(body.begin(), body.begin() + cut);
      // An error's message is the rest of its frame: cut after its code, it is a shorter message.
      CHECK(Parses(part) == (message_is_the_rest && cut >= 13));
    }
    std::vector<char> longer = body;
    longer.push_back('x');
    CHECK(Parses(longer) == message_is_the_rest);
  }
}

void TestImpossibleFieldsAreRefused() {
  std::vector<char> body = Body("7_engine_response.hex");
  CHECK(Parses(body));
  std::vector<char> bad = body;
  bad[8] = 10;  // kind
  CHECK(!Parses(bad));
  bad[8] = static_cast<char>(255);
  CHECK(!Parses(bad));
  // The first tensor: count at 9, name length at 11, name at 13 (10 bytes), datatype at 23, dims at 24, shape at 25.
  for (int datatype : {0, 15, 255}) {
    bad = body;
    bad[23] = static_cast<char>(datatype);
    CHECK(!Parses(bad));
  }
  bad = body;
  bad[24] = 17;  // dims
  CHECK(!Parses(bad));
  bad = body;
  const int64_t negative = -1;
  std::memcpy(&bad[25], &negative, 8);
  CHECK(!Parses(bad));
  bad = body;
  const int64_t two = 2;  // 2 elements of INT32 in 4 bytes
  std::memcpy(&bad[25], &two, 8);
  CHECK(!Parses(bad));
  bad = body;
  const int64_t huge = INT64_MAX;  // elements x size overflowing, not wrapping to the data length
  std::memcpy(&bad[25], &huge, 8);
  std::memcpy(&bad[33], &huge, 8);
  CHECK(!Parses(bad));
  bad = body;
  bad[11] = 0;  // an empty name
  bad[12] = 0;
  CHECK(!Parses(bad));

  std::vector<char> strings = Body("0_response.hex");
  CHECK(Parses(strings));
  // text_output's data: 11 bytes at 34; its first element's length (3) made to run past the data.
  strings[34] = 9;
  CHECK(!Parses(strings));

  std::vector<char> error = Body("2_error.hex");
  error[9] = 8;  // past TRITONSERVER_ERROR_CANCELLED
  CHECK(!Parses(error));

  std::vector<char> claim = Body("3_claim.hex");
  claim.pop_back();  // a 15-byte token
  CHECK(!Parses(claim));
}

void TestTheSplitterRefusesImpossibleLengths() {
  const std::vector<char> whole = Fixture("7_engine_response.hex");
  FrameSplitter splitter;
  std::vector<char> body;
  uint32_t length = 0;
  splitter.Append(whole.data(), 3);
  CHECK(splitter.Next(&body, &length) == FrameSplitter::kNeedMore);
  splitter.Append(whole.data() + 3, whole.size() - 3 - 1);
  CHECK(splitter.Next(&body, &length) == FrameSplitter::kNeedMore);
  splitter.Append(whole.data() + whole.size() - 1, 1);
  splitter.Append(whole.data(), whole.size());  // a second one behind it
  CHECK(splitter.Next(&body, &length) == FrameSplitter::kFrame && body == Body("7_engine_response.hex"));
  CHECK(splitter.Next(&body, &length) == FrameSplitter::kFrame);
  CHECK(splitter.Next(&body, &length) == FrameSplitter::kNeedMore && splitter.Empty());
  splitter.Compact();

  for (uint32_t impossible : {0u, 8u, kMaxFrameBytes + 1, 0xffffffffu}) {
    FrameSplitter fresh;
    fresh.Append(reinterpret_cast<const char*>(&impossible), 4);
    const FrameSplitter::Result result = fresh.Next(&body, &length);
    CHECK(result == (impossible < kHeaderBytes ? FrameSplitter::kUndersized : FrameSplitter::kOversized));
    CHECK(length == impossible);
  }
}

// Random bodies and mutated fixtures: refused or read, never a crash or a read out of bounds (the test runs under
// AddressSanitizer and UBSan).
void TestRandomBytesNeverCrash() {
  std::mt19937_64 random(20261125);
  std::vector<std::vector<char>> seeds;
  for (const char* name : {"0_response.hex", "2_error.hex", "3_claim.hex", "5_engine_request.hex",
                           "7_engine_response.hex", "8_engine_final.hex"}) {
    seeds.push_back(Body(name));
  }
  size_t parsed = 0;
  for (int round = 0; round < 200000; ++round) {
    std::vector<char> body;
    if (round % 2 == 0) {
      body.resize(random() % 96);
      for (char& byte : body) byte = static_cast<char>(random());
      if (body.size() > 8) body[8] = static_cast<char>(random() % 12);  // mostly kinds that exist
    } else {
      body = seeds[random() % seeds.size()];
      for (int flips = 1 + random() % 4; flips > 0; --flips) body[random() % body.size()] = static_cast<char>(random());
    }
    Frame frame;
    if (ParseFrame(body.data(), body.size(), &frame).empty()) {
      ++parsed;
      for (const FrameTensor& tensor : frame.tensors) CHECK(tensor.data + tensor.length <= body.size());
    }
  }
  CHECK(parsed > 0);  // mutations that leave a valid frame exist (e.g. in data bytes): the check above ran
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: frames_test <tests/fixtures/relay_frames>\n");
    return 2;
  }
  fixtures = argv[1];
  TestEveryKindReads();
  TestTheRelaysFramesAreWrittenAsTheFixtures();
  TestHashes();
  TestTruncatedAndTrailingBytesAreRefused();
  TestImpossibleFieldsAreRefused();
  TestTheSplitterRefusesImpossibleLengths();
  TestRandomBytesNeverCrash();
  return llama3_relay_tests::Finish("relay frames");
}
