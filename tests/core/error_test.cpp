#include <catch2/catch.hpp>

#include "core/error.hpp"

using namespace xserv;

TEST_CASE("throw_error formats the message and keeps the code", "[core]") {
  try {
    throw_error(ErrorCode::format, "{}: tensor '{}' has {} bytes", "model.safetensors", "wte", 12);
    FAIL("no throw");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::format);
    CHECK(std::string(e.what()) == "model.safetensors: tensor 'wte' has 12 bytes");
  }
}

TEST_CASE("XSERV_CHECK throws only when the condition fails", "[core]") {
  CHECK_NOTHROW([] { XSERV_CHECK(1 + 1 == 2, ErrorCode::internal, "math"); }());
  CHECK_THROWS_AS([] { XSERV_CHECK(false, ErrorCode::invalid_argument, "bad {}", 1); }(), Error);
}

TEST_CASE("every error code has a name", "[core]") {
  for (int c = 0; c <= static_cast<int>(ErrorCode::internal); ++c)
    CHECK(to_string(static_cast<ErrorCode>(c)) != "unknown error");
}
