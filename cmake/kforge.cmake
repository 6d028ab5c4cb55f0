# Shared helpers for the component CMakeLists.

# kforge_test(NAME SOURCES... LIBS ... [LABELS ...])
# One gtest binary per test file; each test case becomes its own CTest test
# (gtest_discover_tests), so `ctest -L gpu` / `-LE gpu` select by label.
include(GoogleTest)
function(kforge_test name)
  cmake_parse_arguments(KT "" "" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${KT_SOURCES})
  target_link_libraries(${name} PRIVATE ${KT_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  set(labels unit)
  if(KT_LABELS)
    set(labels ${KT_LABELS})
  endif()
  gtest_discover_tests(${name}
    # A GPU test without a GPU calls GTEST_SKIP with its reason; CTest then
    # reports it as skipped rather than passed.
    PROPERTIES LABELS "${labels}" SKIP_REGULAR_EXPRESSION "\\[  SKIPPED \\]"
    DISCOVERY_TIMEOUT 60
    TEST_PREFIX "${name}.")
endfunction()

# kforge_embed(TARGET VAR FILE): makes the text of FILE available to C++ as
#   extern const char* const VAR;  (declared by the including code)
# Kernel templates stay plain .cuh files that editors and NVRTC both read.
function(kforge_embed target var file)
  set(out ${CMAKE_CURRENT_BINARY_DIR}/embed_${var}.cc)
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DIN=${file} -DOUT=${out} -DVAR=${var}
            -P ${PROJECT_SOURCE_DIR}/cmake/embed.cmake
    DEPENDS ${file} ${PROJECT_SOURCE_DIR}/cmake/embed.cmake
    VERBATIM)
  target_sources(${target} PRIVATE ${out})
endfunction()
