#include "ringrun/common/line_tail.h"

namespace ringrun {

void LineTail::Push(std::string_view line) {
  lines_.emplace_back(line);
  while (lines_.size() > max_lines_) lines_.pop_front();
}

std::string LineTail::Text() const {
  std::string out;
  for (const std::string& line : lines_) {
    if (&line != &lines_.front()) out += '\n';
    out += line;
  }
  return out;
}

}  // namespace ringrun
