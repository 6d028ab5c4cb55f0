# Writes IN (proto/kforge/v1/kforge.proto) to OUT with the lite runtime
# option: lite messages register no descriptors in libprotobuf's global pool,
# so libkforge_runtime.so loads into processes that also hold the full
# generated code (kforge's own binaries, tests) without a duplicate-file abort.
file(READ ${IN} content)
string(REPLACE "\npackage kforge.v1;\n" "\npackage kforge.v1;\n\noption optimize_for = LITE_RUNTIME;\n"
       content "${content}")
if(NOT content MATCHES "LITE_RUNTIME")
  message(FATAL_ERROR "${IN}: no 'package kforge.v1;' line to put the lite option after")
endif()
file(WRITE ${OUT} "${content}")
