# find_package(xserv CONFIG) support, pkg-config file, headers and the library.
include(CMakePackageConfigHelpers)

install(TARGETS xserv EXPORT xservTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${PROJECT_SOURCE_DIR}/capi/xserv.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/xserv DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp")

# A static libxserv carries its internal dependencies; the shared one hides them.
if(XSERV_BUILD_SHARED)
  set(XSERV_PC_PRIVATE_LIBS "")
else()
  install(TARGETS xserv_internal EXPORT xservTargets ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  set(XSERV_PC_PRIVATE_LIBS "-lxserv_internal -lsimdjson -lfmt -lpcre2-8 -lutf8proc -lstdc++ -lpthread")
endif()

install(EXPORT xservTargets NAMESPACE xserv:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/xserv)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/xservConfig.cmake.in
  ${PROJECT_BINARY_DIR}/xservConfig.cmake INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/xserv)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/xservConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMajorVersion)
install(FILES ${PROJECT_BINARY_DIR}/xservConfig.cmake ${PROJECT_BINARY_DIR}/xservConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/xserv)

configure_file(${PROJECT_SOURCE_DIR}/cmake/xserv.pc.in ${PROJECT_BINARY_DIR}/xserv.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/xserv.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
