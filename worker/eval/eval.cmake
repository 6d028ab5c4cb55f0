# Included from worker/CMakeLists.txt (an include rather than a subdirectory,
# so the targets and tests land in the worker's build folder).
# kforge_eval: verifies a compiled candidate against the GPU reference on
# random jagged batches and times it (in-process; the worker runs it inside
# its sandboxed child).
find_package(fmt CONFIG REQUIRED)

add_library(kforge_eval
  ${CMAKE_CURRENT_LIST_DIR}/eval.cc
  ${CMAKE_CURRENT_LIST_DIR}/compare.cc
  ${CMAKE_CURRENT_LIST_DIR}/device_tools.cc
  ${CMAKE_CURRENT_LIST_DIR}/batches.cc
  ${CMAKE_CURRENT_LIST_DIR}/launches.cc)
kforge_embed(kforge_eval kEvalKernelsSource ${CMAKE_CURRENT_LIST_DIR}/eval_kernels.cu)
target_link_libraries(kforge_eval
  PUBLIC kforge_gpu kforge_reference kforge_kernels kforge_core absl::status absl::statusor
  PRIVATE fmt::fmt)

kforge_test(eval_unit_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/compare_test.cc ${CMAKE_CURRENT_LIST_DIR}/batches_test.cc
  ${CMAKE_CURRENT_LIST_DIR}/launches_test.cc LIBS kforge_eval fmt::fmt)
kforge_test(eval_gpu_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/eval_gpu_test.cc
  LIBS kforge_eval kforge_bad_kernel_corpus nlohmann_json::nlohmann_json fmt::fmt LABELS gpu)
kforge_test(device_tools_gpu_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/device_tools_gpu_test.cc
  LIBS kforge_eval LABELS gpu)
