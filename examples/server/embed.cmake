# Writes OUT, a C++ file defining `const char* const xserv::server::kChatPage` with the bytes of
# IN (chat.html) as a raw string literal. Run at build time (examples/server/CMakeLists.txt), so
# the page is edited as a plain HTML file and still ships inside the one binary.
# Usage: cmake -DIN=chat.html -DOUT=chat_page.cpp -P embed.cmake
file(READ "${IN}" content)
string(FIND "${content}" ")xserv_html\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw-string delimiter )xserv_html\"")
endif()
file(WRITE "${OUT}.tmp"
  "// Generated from chat.html by embed.cmake at build time; do not edit.\n"
  "namespace xserv::server {\n"
  "extern const char* const kChatPage;\n"
  "const char* const kChatPage = R\"xserv_html(${content})xserv_html\";\n"
  "}  // namespace xserv::server\n")
file(RENAME "${OUT}.tmp" "${OUT}")
