# `cmake --install`: the public headers (xserv.h and include/xserv/*.hpp), libxserv, the CMake
# package (xservConfig.cmake + version file + exported target xserv::xserv), xserv.pc and the
# tools (xserv-cli, xserv-server). Nothing from lib/ is installed: the internals are inside
# libxserv and hidden.
#
# Every file belongs to one of three install components, which become the Debian packages
# (cmake/XservPackaging.cmake): `runtime` (libxserv.so.0 alone), `dev` (the libxserv.so link,
# headers, CMake package, xserv.pc; a static libxserv.a too) and `tools` (the programs).
include(CMakePackageConfigHelpers)

install(TARGETS xserv EXPORT xservTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/capi/xserv.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT dev)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/xserv DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        COMPONENT dev FILES_MATCHING PATTERN "*.hpp")
# The programs (examples/cli; examples/server when that target exists).
foreach(tool xserv-cli xserv-server)
  if(TARGET ${tool})
    install(TARGETS ${tool} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
  endif()
endforeach()

# A shared libxserv carries its dependencies (DT_NEEDED); a static one leaves them to its
# users, so xservConfig.cmake finds them again (see xservConfig.cmake.in) and xserv.pc lists
# them in Libs itself: a static-only install has nothing else to link, so plain
# `pkg-config --libs xserv` must already be complete.
set(XSERV_PC_STATIC_LIBS "")
if(NOT XSERV_BUILD_SHARED)
  set(XSERV_PC_STATIC_LIBS "-lsimdjson -lfmt -lpcre2-8 -lutf8proc")
  if(XSERV_HAVE_BLAS)
    string(APPEND XSERV_PC_STATIC_LIBS " -lopenblas")
  endif()
  if(XSERV_HAVE_CUDA)
    string(APPEND XSERV_PC_STATIC_LIBS
           " -L${CUDAToolkit_LIBRARY_DIR} -lcublasLt -lcublas -lcudart_static -ldl -lrt")
  endif()
  string(APPEND XSERV_PC_STATIC_LIBS " -lstdc++ -lm -pthread")
endif()

install(EXPORT xservTargets NAMESPACE xserv:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/xserv
        COMPONENT dev)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/xservConfig.cmake.in
  ${PROJECT_BINARY_DIR}/xservConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/xserv)
# 0.x: every minor version may change the ABI (the SONAME says which), so only the same
# major.minor is compatible; from 1.0 on this becomes SameMajorVersion.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/xservConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/xservConfig.cmake ${PROJECT_BINARY_DIR}/xservConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/xserv COMPONENT dev)

# xserv.pc finds its prefix relative to itself (${pcfiledir}), so `cmake --install --prefix P`
# and a moved install tree both work, whatever CMAKE_INSTALL_PREFIX was at configure time.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(XSERV_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(XSERV_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
else()
  file(RELATIVE_PATH xserv_pc_up "/prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/prefix")
  string(REGEX REPLACE "/$" "" xserv_pc_up "${xserv_pc_up}")
  set(XSERV_PC_PREFIX "\${pcfiledir}/${xserv_pc_up}")
  set(XSERV_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(XSERV_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(XSERV_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(${PROJECT_SOURCE_DIR}/cmake/xserv.pc.in ${PROJECT_BINARY_DIR}/xserv.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/xserv.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig
        COMPONENT dev)

include(XservPackaging)
