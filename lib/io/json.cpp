#include "io/json.hpp"

#include "core/error.hpp"

namespace xserv::json {

simdjson::dom::element parse(simdjson::dom::parser& parser, std::string_view text,
                             const std::string& source) {
  simdjson::padded_string padded(text);
  simdjson::dom::element root;
  auto err = parser.parse(padded).get(root);
  if (err) throw_error(ErrorCode::format, "{}: invalid JSON: {}", source, simdjson::error_message(err));
  return root;
}

namespace {
// Looks a key up; false when absent or null.
bool lookup(simdjson::dom::object obj, std::string_view key, simdjson::dom::element& out) {
  if (obj.at_key(key).get(out) != simdjson::SUCCESS) return false;
  return !out.is_null();
}
[[noreturn]] void wrong_type(const std::string& source, std::string_view key, const char* want) {
  throw_error(ErrorCode::format, "{}: field '{}' must be {}", source, key, want);
}
}  // namespace

std::optional<std::int64_t> get_int(simdjson::dom::object obj, std::string_view key,
                                    const std::string& source) {
  simdjson::dom::element e;
  if (!lookup(obj, key, e)) return std::nullopt;
  std::int64_t v = 0;
  if (e.get_int64().get(v) == simdjson::SUCCESS) return v;
  std::uint64_t u = 0;
  if (e.get_uint64().get(u) == simdjson::SUCCESS) wrong_type(source, key, "an integer in range");
  double d = 0;  // 1.0 written by some exporters for an integer field
  // The range check comes first: converting a double outside int64's range (1e28) is undefined
  // behaviour (found by tests/fuzz/fuzz_config).
  if (e.get_double().get(d) == simdjson::SUCCESS && d > -9.0e18 && d < 9.0e18 &&
      d == static_cast<double>(static_cast<std::int64_t>(d)))
    return static_cast<std::int64_t>(d);
  wrong_type(source, key, "an integer");
}

std::optional<double> get_number(simdjson::dom::object obj, std::string_view key,
                                  const std::string& source) {
  simdjson::dom::element e;
  if (!lookup(obj, key, e)) return std::nullopt;
  double d = 0;
  if (e.get_double().get(d) == simdjson::SUCCESS) return d;
  std::int64_t i = 0;
  if (e.get_int64().get(i) == simdjson::SUCCESS) return static_cast<double>(i);
  std::uint64_t u = 0;
  if (e.get_uint64().get(u) == simdjson::SUCCESS) return static_cast<double>(u);
  wrong_type(source, key, "a number");
}

std::optional<bool> get_bool(simdjson::dom::object obj, std::string_view key,
                             const std::string& source) {
  simdjson::dom::element e;
  if (!lookup(obj, key, e)) return std::nullopt;
  bool b = false;
  if (e.get_bool().get(b) == simdjson::SUCCESS) return b;
  wrong_type(source, key, "true or false");
}

std::optional<std::string> get_string(simdjson::dom::object obj, std::string_view key,
                                      const std::string& source) {
  simdjson::dom::element e;
  if (!lookup(obj, key, e)) return std::nullopt;
  std::string_view s;
  if (e.get_string().get(s) == simdjson::SUCCESS) return std::string(s);
  wrong_type(source, key, "a string");
}

}  // namespace xserv::json
