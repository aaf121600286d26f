// LineTail (ringrun/common/line_tail.h): the stderr tail of ranks, srun and SSH agents.
#include "ringrun/common/line_tail.h"

#include <catch2/catch.hpp>

namespace ringrun {
namespace {

TEST_CASE("line tail: the last lines, oldest first, joined by newlines", "[line_tail]") {
  LineTail tail(3);
  CHECK(tail.empty());
  CHECK(tail.Text() == "");
  tail.Push("one");
  CHECK(tail.Text() == "one");
  tail.Push("two");
  tail.Push("three");
  CHECK(tail.Text() == "one\ntwo\nthree");
  tail.Push("four");
  CHECK(tail.Text() == "two\nthree\nfour");
  CHECK_FALSE(tail.empty());
}

TEST_CASE("line tail: empty lines are lines", "[line_tail]") {
  LineTail tail(2);
  tail.Push("");
  tail.Push("after");
  CHECK(tail.Text() == "\nafter");
  tail.Push("");
  CHECK(tail.Text() == "after\n");
}

TEST_CASE("line tail: keeping no line keeps nothing", "[line_tail]") {
  LineTail tail(0);
  tail.Push("gone");
  CHECK(tail.empty());
  CHECK(tail.Text() == "");
}

}  // namespace
}  // namespace ringrun
