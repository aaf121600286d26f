// NameTable: tensor names to the engine's slots, looked up once per submission.
//
// Why not std::unordered_map: a lookup there hashes, takes the hash modulo a prime (a
// division), follows a bucket to a node and compares names without a stored hash; about 130
// instructions, a fifth of a whole small submission. Here the table is open addressing with
// linear probing over a power-of-two array of {hash, name, value}: one hash, a mask, and in the
// steady state one probe whose stored hash matches before the name is compared. Erasing shifts
// the following entries back (no tombstones), so a table that churns through made-up names of
// unnamed tensors never degrades.
//
// Not thread-safe: the engine guards each table with its own lock or confines it to a thread.
// Keys are views: the caller keeps every key's characters alive while it is in the table.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

namespace ringrun::runtime::engine {

// A fast hash of a tensor name (eight bytes at a time; names are not adversarial).
struct NameHash {
  size_t operator()(std::string_view s) const noexcept;
};

inline size_t NameHash::operator()(std::string_view s) const noexcept {
  const char* p = s.data();
  const size_t size = s.size();
  uint64_t h = 0x9e3779b97f4a7c15ull ^ size;
  auto mix = [&h](uint64_t v) {
    h = (h ^ v) * 0xff51afd7ed558ccdull;
    h ^= h >> 32;
  };
  uint64_t v = 0;
  if (size >= 8) {
    size_t i = 0;
    for (; i + 8 < size; i += 8) {
      std::memcpy(&v, p + i, 8);
      mix(v);
    }
    std::memcpy(&v, p + size - 8, 8);  // the last 8 bytes (overlapping the previous ones)
  } else {
    for (size_t i = 0; i < size; ++i) v |= uint64_t{static_cast<unsigned char>(p[i])} << (8 * i);
  }
  h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
  return static_cast<size_t>(h ^ (h >> 29));
}

template <typename V>
class NameTable {
 public:
  // The value under `key`, or nullptr.
  V* Find(std::string_view key) const { return Find(key, NameHash{}(key)); }
  V* Find(std::string_view key, size_t hash) const {
    if (size_ == 0) return nullptr;
    for (size_t i = hash & mask_;; i = (i + 1) & mask_) {
      const Cell& c = cells_[i];
      if (!c.value) return nullptr;
      if (c.hash == hash && c.key.size() == key.size() &&
          std::memcmp(c.key.data(), key.data(), key.size()) == 0) {
        return c.value;
      }
    }
  }
  // Adds key -> value (not null) unless key is there already (as emplace: false, and the
  // value there is kept).
  bool Insert(std::string_view key, V* value) {
    const size_t hash = NameHash{}(key);
    if (Find(key, hash)) return false;
    if ((size_ + 1) * 4 > cells_.size() * 3) Grow();
    size_t i = hash & mask_;
    while (cells_[i].value) i = (i + 1) & mask_;
    cells_[i] = Cell{hash, key, value};
    ++size_;
    return true;
  }
  // Removes key if present.
  void Erase(std::string_view key) {
    if (size_ == 0) return;
    const size_t hash = NameHash{}(key);
    size_t i = hash & mask_;
    for (;; i = (i + 1) & mask_) {
      const Cell& c = cells_[i];
      if (!c.value) return;
      if (c.hash == hash && c.key == key) break;
    }
    // Backward shift: move each later entry of the run into the hole when its home position
    // does not lie cyclically in (hole, its position].
    size_t hole = i;
    for (size_t j = (i + 1) & mask_; cells_[j].value; j = (j + 1) & mask_) {
      const size_t home = cells_[j].hash & mask_;
      const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
      if (!stays) {
        cells_[hole] = cells_[j];
        hole = j;
      }
    }
    cells_[hole] = Cell{};
    --size_;
  }
  size_t size() const { return size_; }
  void Clear() {
    std::vector<Cell>().swap(cells_);
    mask_ = 0, size_ = 0;
  }

 private:
  struct Cell {
    size_t hash = 0;
    std::string_view key;
    V* value = nullptr;  // nullptr: empty
  };
  void Grow() {
    std::vector<Cell> old = std::move(cells_);
    cells_.assign(old.empty() ? 64 : old.size() * 2, Cell{});
    mask_ = cells_.size() - 1;
    for (const Cell& c : old) {
      if (!c.value) continue;
      size_t i = c.hash & mask_;
      while (cells_[i].value) i = (i + 1) & mask_;
      cells_[i] = c;
    }
  }

  std::vector<Cell> cells_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

}  // namespace ringrun::runtime::engine
