# cmake --install: the libraries a consumer of outrun::host links (outrun_host is static, so its
# static dependencies are installed and exported too), the package config for find_package(outrun),
# and the systemd unit. Binaries and headers are installed next to their targets.
include(CMakePackageConfigHelpers)
set_target_properties(outrun_host PROPERTIES EXPORT_NAME host)
set_target_properties(outrun_sandbox PROPERTIES EXPORT_NAME sandbox)
set_target_properties(outrun_protocol PROPERTIES EXPORT_NAME protocol)
set_target_properties(outrun_codec PROPERTIES EXPORT_NAME codec)
set_target_properties(outrun_log_ring PROPERTIES EXPORT_NAME log_ring)
set_target_properties(outrun_platform PROPERTIES EXPORT_NAME platform)
set_target_properties(outrun_platform_io PROPERTIES EXPORT_NAME platform_io)
install(TARGETS outrun_host outrun_sandbox outrun_codec outrun_protocol outrun_log_ring
  outrun_platform outrun_platform_io EXPORT outrunTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(EXPORT outrunTargets NAMESPACE outrun:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/outrun)
configure_package_config_file(${CMAKE_CURRENT_LIST_DIR}/outrunConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/outrunConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/outrun
  PATH_VARS CMAKE_INSTALL_LIBEXECDIR CMAKE_INSTALL_SBINDIR)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/outrunConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/outrunConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/outrunConfigVersion.cmake
  ${CMAKE_CURRENT_LIST_DIR}/package_worker.cpp
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/outrun)
# The documents the unit's Documentation= names (and the rest of design/).
file(GLOB outrun_design_docs ${PROJECT_SOURCE_DIR}/design/*.md)
install(FILES ${PROJECT_SOURCE_DIR}/README.md ${outrun_design_docs} DESTINATION ${CMAKE_INSTALL_DOCDIR})
# The unit names /usr/local/sbin/outrund; the installed copy names the install prefix's (computed at
# install time, so `cmake --install --prefix P` is honoured).
install(CODE "
  file(READ \"${PROJECT_SOURCE_DIR}/scripts/outrund.service\" unit)
  string(REPLACE \"/usr/local/sbin\" \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_SBINDIR}\" unit \"\${unit}\")
  string(REPLACE \"/usr/local/bin\" \"\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_BINDIR}\" unit \"\${unit}\")
  string(REPLACE \"file:///usr/local/share/doc/outrun\" \"file://\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_DOCDIR}\" unit \"\${unit}\")
  set(dest \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/systemd/system\")
  file(MAKE_DIRECTORY \"\${dest}\")
  file(WRITE \"\${dest}/outrund.service\" \"\${unit}\")
  message(STATUS \"Installing: \${dest}/outrund.service\")
")
