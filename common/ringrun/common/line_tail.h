// The last lines of a stream, kept for failure messages: a child's stderr (a rank's, srun's, an
// SSH agent's). Not thread-safe: its owner guards it.
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <string_view>

namespace ringrun {

class LineTail {
 public:
  explicit LineTail(size_t max_lines) : max_lines_(max_lines) {}

  // One line, without its '\n'. The oldest line goes once there are more than max_lines.
  void Push(std::string_view line);
  // The lines kept, oldest first, joined by '\n' (no '\n' after the last); "" for none.
  std::string Text() const;
  bool empty() const { return lines_.empty(); }

 private:
  size_t max_lines_;
  std::deque<std::string> lines_;
};

}  // namespace ringrun
