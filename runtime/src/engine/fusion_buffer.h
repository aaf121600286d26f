// The host fusion buffer: allocated once, at the first batch that needs it, at the threshold's
// size, and reused for every batch after (fused batches never exceed the threshold).
#pragma once

#include <cstddef>
#include <memory>

namespace ringrun::runtime::engine {

class FusionBuffer {
 public:
  explicit FusionBuffer(size_t threshold) : threshold_(threshold) {}
  size_t threshold() const { return threshold_; }
  char* data() {
    if (!data_) data_.reset(new char[threshold_]);
    return data_.get();
  }
  bool allocated() const { return data_ != nullptr; }
  void Release() { data_.reset(); }  // at shutdown (a later batch would allocate it again)

 private:
  const size_t threshold_;
  std::unique_ptr<char[]> data_;
};

}  // namespace ringrun::runtime::engine
