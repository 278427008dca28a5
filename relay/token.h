// Stream tokens: HMAC-SHA256(key, stream as u64 little-endian), its first kTokenBytes bytes. The key is the relay's
// (random at load, in the file `key` beside its socket, 0600 in its 0700 directory): the relay hands each stream's
// token to the Python model with the stream, the claim must present it, and the Python side recomputes it
// (bls/relay/frames.py) before it claims anything, so that a request sent to the Python model directly with made-up
// relay parameters is refused there instead of claiming someone else's stream on the process's connection.
#pragma once

#include <cstdint>
#include <string>

namespace llama3_relay {

constexpr size_t kKeyBytes = 32;

std::string Sha256(const std::string& data);
std::string HmacSha256(const std::string& key, const std::string& message);
std::string StreamToken(const std::string& key, uint64_t stream);

}  // namespace llama3_relay
