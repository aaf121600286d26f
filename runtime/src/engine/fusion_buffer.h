// The host fusion buffer: allocated once, at the first batch that needs it, at the threshold's
// size, and reused for every batch after (fused batches never exceed the threshold). The
// autotuner may change the threshold between rounds; a larger one than the buffer holds
// allocates it again at the next batch.
#pragma once

#include <cstddef>
#include <memory>

namespace ringrun::runtime::engine {

class FusionBuffer {
 public:
  explicit FusionBuffer(size_t threshold) : threshold_(threshold) {}
  size_t threshold() const { return threshold_; }
  void set_threshold(size_t threshold) { threshold_ = threshold; }
  char* data() {
    if (!data_ || capacity_ < threshold_) data_.reset(new char[threshold_]), capacity_ = threshold_;
    return data_.get();
  }
  bool allocated() const { return data_ != nullptr; }
  void Release() { data_.reset(); }  // at shutdown (a later batch would allocate it again)

 private:
  size_t threshold_;
  size_t capacity_ = 0;  // of data_
  std::unique_ptr<char[]> data_;
};

}  // namespace ringrun::runtime::engine
