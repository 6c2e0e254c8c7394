// Small helpers over simdjson's DOM for the loaders: typed field access whose errors name the
// file and the field.
#pragma once

#include <simdjson.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace xserv::json {

// Parses `text` (copied into simdjson's padded buffer); throws Error(format) naming `source`.
simdjson::dom::element parse(simdjson::dom::parser& parser, std::string_view text,
                             const std::string& source);

// Optional typed fields: nullopt when absent or JSON null; Error(format) when of another type.
std::optional<std::int64_t> get_int(simdjson::dom::object obj, std::string_view key,
                                    const std::string& source);
std::optional<double> get_number(simdjson::dom::object obj, std::string_view key,
                                  const std::string& source);
std::optional<bool> get_bool(simdjson::dom::object obj, std::string_view key,
                             const std::string& source);
std::optional<std::string> get_string(simdjson::dom::object obj, std::string_view key,
                                      const std::string& source);

}  // namespace xserv::json
