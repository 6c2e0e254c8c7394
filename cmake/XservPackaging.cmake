# `cpack` (run in a build folder) makes Debian packages from the install components
# (cmake/XservInstall.cmake):
#   libxserv0      runtime: libxserv.so.0 (the package is named after the SONAME, as Debian's
#                  library packaging policy asks, so an ABI break installs side by side)
#   libxserv-dev   header, C++ header, libxserv.so link, CMake package, xserv.pc
#   xserv-tools    xserv-cli (and xserv-server when it is built)
# Build them from a folder configured with -DCMAKE_INSTALL_PREFIX=/usr (the library then goes to
# Debian's multiarch lib/x86_64-linux-gnu); scripts/test-packages.sh does it and tests them.
# Package dependencies come from dpkg-shlibdeps. A CUDA build links the CUDA toolkit's own
# libraries, which no Debian package of the system owns, so shlibdeps is off there and the
# packages leave the CUDA runtime to the user (the toolkit, or NVIDIA's cuda-libraries packages).
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME xserv)
set(CPACK_PACKAGE_VENDOR "xserv")
set(CPACK_PACKAGE_CONTACT "xserv maintainers <xserv@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_RESOURCE_FILE_LICENSE ${PROJECT_SOURCE_DIR}/LICENSE)
set(CPACK_PACKAGE_DIRECTORY ${PROJECT_BINARY_DIR}/packages)

set(CPACK_DEB_COMPONENT_INSTALL ON)
# Only these: anything installed without a component is a mistake, not a fourth package.
set(CPACK_COMPONENTS_ALL runtime dev tools)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION libs)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://example.invalid/xserv")
if(XSERV_HAVE_CUDA)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS OFF)
else()
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
endif()
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)

set(CPACK_DEBIAN_RUNTIME_PACKAGE_NAME libxserv0)
set(CPACK_COMPONENT_RUNTIME_DESCRIPTION
    "xserv runtime library (libxserv.so.0)\n libxserv loads Hugging Face GPT-2 and Qwen3 checkpoints and generates text\n through a stable C ABI, on the CPU or an NVIDIA GPU.")

set(CPACK_DEBIAN_DEV_PACKAGE_NAME libxserv-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_COMPONENT_DEV_DEPENDS runtime)
set(CPACK_COMPONENT_DEV_DESCRIPTION
    "xserv development files\n The C header xserv.h, the C++ header xserv/xserv.hpp, the CMake package\n (find_package(xserv)) and xserv.pc for pkg-config.")
# A static build has no runtime package: the -dev package holds libxserv.a.
if(NOT XSERV_BUILD_SHARED)
  set(CPACK_COMPONENTS_ALL dev tools)
  set(CPACK_COMPONENT_DEV_DEPENDS "")
endif()

set(CPACK_DEBIAN_TOOLS_PACKAGE_NAME xserv-tools)
set(CPACK_DEBIAN_TOOLS_PACKAGE_SECTION utils)
# xserv-server links libxserv.so.0 (xserv-cli links the internals statically): dpkg-shlibdeps
# finds it in the build tree, and the package depends on libxserv0 of the same version.
if(XSERV_BUILD_SHARED)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS ${PROJECT_BINARY_DIR}/capi)  # libxserv.so.0
  set(CPACK_COMPONENT_TOOLS_DEPENDS runtime)
endif()
set(CPACK_COMPONENT_TOOLS_DESCRIPTION
    "xserv command-line tools\n xserv-cli (generate, chat, tokenize, detokenize) and, when built, the\n xserv-server HTTP server.")

include(CPack)
