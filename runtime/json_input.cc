#include "runtime/json_input.h"

#include <algorithm>
#include <unordered_set>
#include <utility>
#include <vector>

namespace zero {

std::string JsonPosition(std::string_view text, size_t index) {
  index = std::min(index, text.size());
  size_t line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < index; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(index - line_start + 1);
}

Status CheckJsonNesting(std::string_view text, const std::string& source, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character cannot end the string
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    switch (c) {
      case '"':
        in_string = true;
        break;
      case '[':
      case '{':
        if (++depth > max_depth) {
          return InvalidArgumentError(source + ": JSON nested deeper than " + std::to_string(max_depth) +
                                      " levels at " + JsonPosition(text, i) + " (zero reads at most " +
                                      std::to_string(max_depth) +
                                      " levels of arrays and objects; the file is malformed or not what it should be)");
        }
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;  // unbalanced text is the parser's to report
        break;
      default:
        break;
    }
  }
  return OkStatus();
}

namespace {

// Builds a J bottom-up from nlohmann's SAX events. Each open array/object is a frame holding its
// value; a finished value moves into its parent, so no pointer into a container is ever kept.
// Objects are filled without nlohmann's per-insert search (linear in the object's size for
// ordered_json): a hash set per open object finds duplicates instead.
template <typename J>
class BuildingSax {
 public:
  using number_integer_t = typename J::number_integer_t;
  using number_unsigned_t = typename J::number_unsigned_t;
  using number_float_t = typename J::number_float_t;
  using string_t = typename J::string_t;
  using binary_t = typename J::binary_t;

  BuildingSax(std::string_view text, const std::string& source, int max_depth)
      : text_(text), source_(source), max_depth_(max_depth) {}

  bool null() { return Put(J(nullptr)); }
  bool boolean(bool v) { return Put(J(v)); }
  bool number_integer(number_integer_t v) { return Put(J(v)); }
  bool number_unsigned(number_unsigned_t v) { return Put(J(v)); }
  bool number_float(number_float_t v, const string_t& /*text*/) { return Put(J(v)); }
  bool string(string_t& v) { return Put(J(std::move(v))); }
  bool binary(binary_t& /*v*/) {
    status_ = InternalError(source_ + ": binary value in JSON text");
    return false;
  }

  bool start_object(std::size_t /*elements*/) { return Open(J::object(), /*object=*/true); }
  bool key(string_t& k) {
    Frame& f = frames_.back();
    if (!f.keys.insert(k).second) {
      f.key = std::move(k);
      status_ = InvalidArgumentError(source_ + ": duplicate key '" + Path() +
                                     "': JSON gives a key one value (DeepSpeed refuses duplicate keys too); "
                                     "remove one of them");
      return false;
    }
    f.key = std::move(k);
    return true;
  }
  bool end_object() { return Close(); }
  bool start_array(std::size_t /*elements*/) { return Open(J::array(), /*object=*/false); }
  bool end_array() { return Close(); }

  bool parse_error(std::size_t position, const std::string& last_token, const nlohmann::detail::exception& ex) {
    // `position` counts the characters read, the last one included.
    const size_t last = position == 0 ? 0 : position - 1;
    if (ex.id == 406) {  // out_of_range.406: a number beyond double's range
      const size_t start = last + 1 >= last_token.size() ? last + 1 - last_token.size() : 0;
      const std::string where = Path();
      status_ = InvalidArgumentError(source_ + ": number " + Shorten(last_token) + " at " + JsonPosition(text_, start) +
                                     (where.empty() ? "" : " (key '" + where + "')") +
                                     " is outside the range of a double (magnitude at most 1.8e308)");
      return false;
    }
    std::string detail = ex.what();
    const size_t col_pos = detail.find("column ");
    const size_t colon = col_pos == std::string::npos ? std::string::npos : detail.find(": ", col_pos);
    if (colon != std::string::npos) {
      detail = detail.substr(colon + 2);
    } else if (detail.find("] ") != std::string::npos) {
      detail = detail.substr(detail.find("] ") + 2);
    }
    status_ = InvalidArgumentError(source_ + ": malformed JSON at " + JsonPosition(text_, last) + ": " + detail);
    return false;
  }

  Status status() const { return status_; }
  J TakeRoot() { return std::move(root_); }

 private:
  struct Frame {
    J value;
    bool object = false;
    string_t key;      // object: the key whose value is being read
    size_t index = 0;  // array: elements so far
    std::unordered_set<string_t> keys;
  };

  static std::string Shorten(const std::string& s) { return s.size() > 40 ? s.substr(0, 37) + "..." : s; }

  // "a.b[2].c": where the value being read sits.
  std::string Path() const {
    std::string out;
    for (const Frame& f : frames_) {
      if (f.object) {
        if (!out.empty()) out += '.';
        out += f.key;
      } else {
        out += "[" + std::to_string(f.index) + "]";
      }
    }
    return out;
  }

  bool Open(J value, bool object) {
    // CheckJsonNesting ran first; this keeps the builder safe on its own.
    if (static_cast<int>(frames_.size()) >= max_depth_) {
      status_ = InvalidArgumentError(source_ + ": JSON nested deeper than " + std::to_string(max_depth_) +
                                     " levels at '" + Path() + "'");
      return false;
    }
    Frame f;
    f.value = std::move(value);
    f.object = object;
    frames_.push_back(std::move(f));
    return true;
  }

  bool Close() {
    J done = std::move(frames_.back().value);
    frames_.pop_back();
    return Put(std::move(done));
  }

  bool Put(J v) {
    if (frames_.empty()) {
      root_ = std::move(v);
      return true;
    }
    Frame& f = frames_.back();
    if (!f.object) {
      f.value.template get_ref<typename J::array_t&>().push_back(std::move(v));
      ++f.index;
      return true;
    }
    auto& obj = f.value.template get_ref<typename J::object_t&>();
    using Object = typename J::object_t;
    if constexpr (requires { typename Object::Container; }) {
      // ordered_map (a vector of pairs): the key is new (checked in key()), so append without its
      // linear search for the key.
      static_cast<typename Object::Container&>(obj).emplace_back(std::move(f.key), std::move(v));
    } else {
      obj.emplace(std::move(f.key), std::move(v));
    }
    f.key = string_t();
    return true;
  }

  std::string_view text_;
  const std::string& source_;
  int max_depth_;
  std::vector<Frame> frames_;
  J root_;
  Status status_;
};

}  // namespace

template <typename J>
Result<J> ParseJsonText(std::string_view text, const std::string& source, int max_depth) {
  ZERO_RETURN_IF_ERROR(CheckJsonNesting(text, source, max_depth));
  BuildingSax<J> sax(text, source, max_depth);
  bool ok = false;
  try {
    ok = J::sax_parse(text.begin(), text.end(), &sax);
  } catch (const std::exception& e) {
    // The SAX interface reports parse errors by callback; anything thrown is unexpected.
    return InvalidArgumentError(source + ": JSON: " + e.what());
  }
  if (!ok) {
    Status st = sax.status();
    if (st.ok()) st = InvalidArgumentError(source + ": malformed JSON");
    return st;
  }
  return sax.TakeRoot();
}

template Result<nlohmann::json> ParseJsonText<nlohmann::json>(std::string_view, const std::string&, int);
template Result<nlohmann::ordered_json> ParseJsonText<nlohmann::ordered_json>(std::string_view, const std::string&,
                                                                              int);

}  // namespace zero
