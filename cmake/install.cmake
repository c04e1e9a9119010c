# install.cmake - the install rules, the CMake package and the pkg-config
# files, and the tests that check them; included by the top CMakeLists.txt
# after every part, in its scope (so the paths here are the top
# directory's, as the targets' exports and the tests expect).

# ---- install -----------------------------------------------------------------
# `cmake --install <build> [--prefix P]` installs the CLI, the libraries,
# the headers, pkg-config files (engram.pc, and engram_cuda.pc with the CUDA
# library) and a CMake package (find_package(engram): engramConfig.cmake,
# its version file and the exported targets engram::*).  Both kinds of
# files find the prefix from their own location, so they stay right for
# whatever prefix the install used, and after the tree is moved.
# tests/install/run.sh installs to a scratch prefix and builds apps with both.
include(CMakePackageConfigHelpers)
set(ENGRAM_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/engram
    CACHE STRING "Where to install engramConfig.cmake, relative to the prefix")
mark_as_advanced(ENGRAM_INSTALL_CMAKEDIR)

install(TARGETS engram engram_static EXPORT engramTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
install(TARGETS engram_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES include/engram.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT engramTargets NAMESPACE engram:: DESTINATION ${ENGRAM_INSTALL_CMAKEDIR})
# The same names in a tree that adds engram with add_subdirectory().
add_library(engram::engram ALIAS engram)
add_library(engram::engram_static ALIAS engram_static)
if(ENGRAM_HAVE_CUDA)
  install(TARGETS engram_cuda engram_cuda_static EXPORT engramCudaTargets
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(FILES include/engram_cuda.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  # The kernels' host code needs the C++ runtime of nvcc's host compiler:
  # in this tree nvcc links what uses libengram_cuda.a; installed, a C
  # program linking it gets that runtime from the target (and engram_cuda.pc).
  set(ENGRAM_CUDA_CXX_RUNTIME "")
  foreach(_l IN LISTS CMAKE_CUDA_IMPLICIT_LINK_LIBRARIES)
    if(_l MATCHES "^(stdc\\+\\+|c\\+\\+|c\\+\\+abi)$")
      list(APPEND ENGRAM_CUDA_CXX_RUNTIME ${_l})
    endif()
  endforeach()
  list(REMOVE_DUPLICATES ENGRAM_CUDA_CXX_RUNTIME)
  target_link_libraries(engram_cuda_static PRIVATE "$<INSTALL_INTERFACE:${ENGRAM_CUDA_CXX_RUNTIME}>")
  # In their own file, which engramConfig.cmake loads only where the CUDA
  # toolkit is found: a CPU-only user needs no toolkit.
  install(EXPORT engramCudaTargets NAMESPACE engram:: DESTINATION ${ENGRAM_INSTALL_CMAKEDIR})
  add_library(engram::engram_cuda ALIAS engram_cuda)
  add_library(engram::engram_cuda_static ALIAS engram_cuda_static)
endif()

configure_package_config_file(cmake/engramConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/engramConfig.cmake
  INSTALL_DESTINATION ${ENGRAM_INSTALL_CMAKEDIR})
# 0.x: a minor version may break the API, so only the same 0.MINOR fits.
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(_engram_compat SameMinorVersion)
else()
  set(_engram_compat SameMajorVersion)
endif()
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/engramConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY ${_engram_compat})
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/engramConfig.cmake
              ${CMAKE_CURRENT_BINARY_DIR}/engramConfigVersion.cmake
        DESTINATION ${ENGRAM_INSTALL_CMAKEDIR})

# pkg-config: prefix=${pcfiledir}/.. (as many as the libdir is deep), so the
# paths follow the .pc file wherever the install put it.  An absolute
# CMAKE_INSTALL_LIBDIR or CMAKE_INSTALL_INCLUDEDIR is written as given.
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(ENGRAM_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
  set(ENGRAM_PC_LIBDIR "${CMAKE_INSTALL_LIBDIR}")
  set(ENGRAM_PC_NOTE "written for the prefix ${CMAKE_INSTALL_PREFIX}")
else()
  file(RELATIVE_PATH _engram_up "/p/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/p")
  string(REGEX REPLACE "/$" "" _engram_up "${_engram_up}")
  set(ENGRAM_PC_PREFIX "\${pcfiledir}/${_engram_up}")
  set(ENGRAM_PC_LIBDIR "\${prefix}/${CMAKE_INSTALL_LIBDIR}")
  set(ENGRAM_PC_NOTE "its paths are relative to its own directory")
endif()
if(IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}")
  set(ENGRAM_PC_INCLUDEDIR "${CMAKE_INSTALL_INCLUDEDIR}")
else()
  set(ENGRAM_PC_INCLUDEDIR "\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}")
endif()
configure_file(cmake/engram.pc.in engram.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/engram.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
if(ENGRAM_HAVE_CUDA)
  list(GET CUDAToolkit_INCLUDE_DIRS 0 ENGRAM_PC_CUDA_INCLUDEDIR)
  list(TRANSFORM ENGRAM_CUDA_CXX_RUNTIME PREPEND -l OUTPUT_VARIABLE ENGRAM_PC_CUDA_CXX_RUNTIME)
  list(JOIN ENGRAM_PC_CUDA_CXX_RUNTIME " " ENGRAM_PC_CUDA_CXX_RUNTIME)
  configure_file(cmake/engram_cuda.pc.in engram_cuda.pc @ONLY)
  install(FILES ${CMAKE_CURRENT_BINARY_DIR}/engram_cuda.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
endif()
# tests/install/run.sh: install this tree to a scratch prefix and build apps
# against it with pkg-config and with find_package.  Not in the sanitizer
# and fuzz builds: their instrumented libraries are not what gets installed.
if(BUILD_TESTING AND NOT (ENGRAM_SANITIZE OR ENGRAM_TSAN OR ENGRAM_FUZZ)
   AND NOT IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}" AND NOT IS_ABSOLUTE "${CMAKE_INSTALL_INCLUDEDIR}"
   AND NOT IS_ABSOLUTE "${CMAKE_INSTALL_BINDIR}")
  add_test(NAME install COMMAND ${CMAKE_COMMAND} -E env ENGRAM_SRC=${CMAKE_CURRENT_SOURCE_DIR}
           ENGRAM_BUILD=${CMAKE_CURRENT_BINARY_DIR} CMAKE=${CMAKE_COMMAND} CC=${CMAKE_C_COMPILER}
           "CMAKE_GENERATOR=${CMAKE_GENERATOR}" ENGRAM_LIBDIR=${CMAKE_INSTALL_LIBDIR}
           ENGRAM_VERSION=${PROJECT_VERSION} ENGRAM_HAVE_CUDA=${ENGRAM_HAVE_CUDA}
           sh ${CMAKE_CURRENT_SOURCE_DIR}/tests/install/run.sh)
  set_tests_properties(install PROPERTIES TIMEOUT 600)
endif()
if(BUILD_TESTING)
  # The README's command for the libraries and the CLI alone, configured
  # in a scratch tree: no test, benchmark or fuzz target in it.
  add_test(NAME readme_libs_only COMMAND ${CMAKE_COMMAND} -E env
           ENGRAM_SRC=${CMAKE_CURRENT_SOURCE_DIR} CMAKE=${CMAKE_COMMAND}
           sh ${CMAKE_CURRENT_SOURCE_DIR}/tests/install/libs_only.sh)
  set_tests_properties(readme_libs_only PROPERTIES TIMEOUT 300)
endif()
