# cmake -DLIB=<library> -DNM=<nm> -DWANT="sym;sym;..." -P check_exports.cmake
# Passes when the library's defined dynamic symbols are exactly WANT (default: the net plugin's,
# ncclNetPlugin_v8 .. v12 and ncclTunerPlugin_v2 .. v5): no Loom internals, no libstdc++ or fmt
# symbols leak out of a plugin.
execute_process(COMMAND ${NM} -D --defined-only ${LIB} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "nm -D ${LIB} failed (${rc})")
endif()
string(REPLACE "\n" ";" lines "${out}")
set(found "")
foreach(line IN LISTS lines)
  if(line MATCHES "^[0-9a-fA-F]* *[A-Za-z] (.+)$")
    list(APPEND found "${CMAKE_MATCH_1}")
  endif()
endforeach()
list(SORT found)
if(DEFINED WANT)
  set(want ${WANT})
else()
  set(want ncclNetPlugin_v10 ncclNetPlugin_v11 ncclNetPlugin_v12 ncclNetPlugin_v8 ncclNetPlugin_v9
      ncclTunerPlugin_v2 ncclTunerPlugin_v3 ncclTunerPlugin_v4 ncclTunerPlugin_v5)
endif()
list(SORT want)
if(NOT found STREQUAL want)
  message(FATAL_ERROR "exported symbols of ${LIB}:\n  ${found}\nexpected exactly:\n  ${want}")
endif()
message("OK: ${LIB} exports exactly ${want}")
