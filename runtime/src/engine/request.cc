#include "runtime/src/engine/request.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <string_view>
#include <vector>

#include "runtime/src/engine/wire.h"
#include "runtime/src/reduce.h"

namespace ringrun::runtime::engine {

const char* KindName(Kind k) {
  switch (k) {
    case Kind::kAllreduce:
      return "allreduce";
    case Kind::kBroadcast:
      return "broadcast";
    case Kind::kAllgather:
      return "allgather";
    case Kind::kAlltoall:
      return "alltoall";
    case Kind::kReduceScatter:
      return "reducescatter";
    case Kind::kBarrier:
      return "barrier";
    case Kind::kJoin:
      return "join";
  }
  return "?";
}

namespace {
std::string Num(double v) {
  std::ostringstream o;
  o << v;
  return o.str();
}
}  // namespace

std::string Request::FieldValue(const std::string& field) const {
  if (field == "collective") return KindName(kind);
  if (field == "device") return device ? "GPU" : "CPU";
  if (field == "dtype") return NameOfDtype(dtype);
  if (field == "op") return NameOfOp(op);
  if (field == "scale factors") return "(" + Num(prescale) + ", " + Num(postscale) + ")";
  if (field == "flags") return std::to_string(flags);
  if (field == "root") return std::to_string(root);
  if (field == "count") return std::to_string(count);
  if (field == "row size") return std::to_string(row_elems);
  if (field == "call") return fixed ? "blocking" : "submitted";
  if (field == "shape") {
    if (!shaped) return "no shape";
    std::string v = "(";
    for (size_t i = 0; i < shape.size(); ++i) v += (i ? ", " : "") + std::to_string(shape[i]);
    return v + (shape.size() == 1 ? ",)" : ")");
  }
  return "?";
}

bool Request::ShapesAgree(const Request& o) const {
  if (!shaped || !o.shaped) return true;
  switch (kind) {
    case Kind::kAllreduce:
    case Kind::kReduceScatter:
    case Kind::kBroadcast:
      return shape == o.shape;
    case Kind::kAllgather:
    case Kind::kAlltoall:
      return shape.size() == o.shape.size() &&
             (shape.empty() || std::equal(shape.begin() + 1, shape.end(), o.shape.begin() + 1));
    case Kind::kBarrier:
    case Kind::kJoin:
      return true;
  }
  return true;
}

bool Request::Matches(const Request& o) const {
  if (kind != o.kind || device != o.device || !ShapesAgree(o)) return false;
  switch (kind) {
    case Kind::kAllreduce:
      return dtype == o.dtype && op == o.op && prescale == o.prescale && postscale == o.postscale &&
             flags == o.flags && count == o.count;
    case Kind::kReduceScatter:
      return dtype == o.dtype && op == o.op && count == o.count;
    case Kind::kBroadcast:
      return dtype == o.dtype && root == o.root && count == o.count;
    case Kind::kAllgather:
    case Kind::kAlltoall:
      // A blocking call (fixed) writes into the caller's buffer, a submission into its handle:
      // where a rank's result goes follows the agreed request, so both must be the same kind.
      return dtype == o.dtype && row_elems == o.row_elems && fixed == o.fixed &&
             (!fixed || count == o.count);
    case Kind::kBarrier:
    case Kind::kJoin:
      return true;
  }
  return false;
}

std::string Request::Differs(const Request& o) const {
  if (Matches(o)) return "";  // the common case, without building any string
  std::vector<const char*> fields = {"collective", "device"};
  if (kind != o.kind) return "collective";
  switch (kind) {
    case Kind::kAllreduce:
      fields.insert(fields.end(), {"dtype", "op", "scale factors", "flags", "count"});
      break;
    case Kind::kReduceScatter:
      fields.insert(fields.end(), {"dtype", "op", "count"});
      break;
    case Kind::kBroadcast:
      fields.insert(fields.end(), {"dtype", "root", "count"});
      break;
    case Kind::kAllgather:
    case Kind::kAlltoall:
      fields.insert(fields.end(), {"dtype", "row size", "call"});
      if (fixed || o.fixed) fields.push_back("count");
      break;
    case Kind::kBarrier:
    case Kind::kJoin:
      break;
  }
  // The shape after the dtype (as Horovod checks them) and before the counts it implies:
  // "(2, 3)" against "(3, 2)" says more than 6 against 6.
  if (!ShapesAgree(o)) fields.insert(fields.begin() + 3, "shape");
  for (const char* f : fields) {
    if (f == std::string_view("shape") ? !ShapesAgree(o) : FieldValue(f) != o.FieldValue(f)) {
      return f;
    }
  }
  return "";
}

bool Request::Identical(const Request& o) const { return SameArguments(o) && name == o.name; }

bool Request::SameArguments(const Request& o) const {
  return kind == o.kind && dtype == o.dtype && op == o.op && device == o.device &&
         fixed == o.fixed && root == o.root && count == o.count && row_elems == o.row_elems &&
         std::memcmp(&prescale, &o.prescale, sizeof(double)) == 0 &&
         std::memcmp(&postscale, &o.postscale, sizeof(double)) == 0 && flags == o.flags &&
         send_rows == o.send_rows && shaped == o.shaped && shape == o.shape;
}

void Request::Encode(std::string* out) const {
  PutString(out, name);
  Put<uint8_t>(out, static_cast<uint8_t>(kind));
  Put<uint8_t>(out, static_cast<uint8_t>(dtype));
  Put<uint8_t>(out, static_cast<uint8_t>(op));
  Put<uint8_t>(out, static_cast<uint8_t>((device ? 1 : 0) | (fixed ? 2 : 0) | (shaped ? 4 : 0)));
  Put<int32_t>(out, root);
  Put<uint64_t>(out, count);
  Put<uint64_t>(out, row_elems);
  Put<double>(out, prescale);
  Put<double>(out, postscale);
  Put<uint32_t>(out, flags);
  Put<uint32_t>(out, static_cast<uint32_t>(send_rows.size()));
  for (uint64_t r : send_rows) Put<uint64_t>(out, r);
  if (shaped) {
    Put<uint32_t>(out, static_cast<uint32_t>(shape.size()));
    for (int64_t d : shape) Put<int64_t>(out, d);
  }
}

bool Request::Decode(const std::string& in, size_t* pos) {
  uint8_t k, d, o, bits;
  uint32_t n;
  if (!GetString(in, pos, &name) || !Get(in, pos, &k) || !Get(in, pos, &d) || !Get(in, pos, &o) ||
      !Get(in, pos, &bits) || !Get(in, pos, &root) || !Get(in, pos, &count) ||
      !Get(in, pos, &row_elems) || !Get(in, pos, &prescale) || !Get(in, pos, &postscale) ||
      !Get(in, pos, &flags) || !Get(in, pos, &n)) {
    return false;
  }
  if (k > static_cast<uint8_t>(Kind::kJoin) || !IsValidDtype(d) || !IsValidOp(o)) return false;
  kind = static_cast<Kind>(k), dtype = static_cast<ringrun_dtype>(d);
  op = static_cast<ringrun_op>(o), device = bits & 1, fixed = bits & 2, shaped = bits & 4;
  if (n > (in.size() - *pos) / 8) return false;
  send_rows.resize(n);
  for (uint64_t& r : send_rows) Get(in, pos, &r);
  shape.clear();
  if (shaped) {
    uint32_t ndims;
    if (!Get(in, pos, &ndims) || ndims > (in.size() - *pos) / 8) return false;
    shape.resize(ndims);
    for (int64_t& d : shape) Get(in, pos, &d);
  }
  return true;
}

}  // namespace ringrun::runtime::engine
