# libFuzzer targets. The top CMakeLists includes this file when KIMIRT_FUZZ=ON, best before the
# add_subdirectory() of the layers (see "Instrumentation"); scripts/fuzz.sh configures such a
# build (clang, tests and benches off), builds every target and runs each for a while.
#
# kimirt_fuzz_target(NAME <name> SOURCE <file.cpp> LIBS <libs...>)
#   Builds the executable <build>/fuzz/<name> from one source that defines
#   LLVMFuzzerTestOneInput, compiled and linked with -fsanitize=fuzzer,address,undefined and
#   linked against <libs> (layer libraries: kimirt_io, kimirt_model, ...; each brings the
#   layers below it). Adds <name> to the global property KIMIRT_FUZZ_TARGETS.
#
# kimirt_fuzz_all()
#   One kimirt_fuzz_target per src/kimirt/<layer>/*_fuzz.cpp, named after the file
#   (safetensors_header_fuzz.cpp -> safetensors_header_fuzz) and linked against
#   kimirt_<layer>. Runs by itself at the end of the top-level CMakeLists
#   (cmake_language(DEFER)), when every layer library exists; set KIMIRT_FUZZ_NO_AUTO before
#   the include() to call it yourself instead.
#
# Instrumentation: every target created after the include() is compiled with
# -fsanitize=fuzzer-no-link,address,undefined (coverage feedback inside the libraries, and
# ASan/UBSan in them) and linked with ASan/UBSan. Targets created before the include() are not;
# scripts/fuzz.sh also passes the flags through CMAKE_CXX_FLAGS so the include position does
# not matter for its builds.

if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "KIMIRT_FUZZ needs clang (libFuzzer): configure with CC=clang CXX=clang++")
endif()

set(KIMIRT_FUZZ_SANITIZERS "address,undefined")
# UBSan findings must stop the run (and count as a crash), not just print.
add_compile_options(-fsanitize=fuzzer-no-link,${KIMIRT_FUZZ_SANITIZERS}
                    -fno-sanitize-recover=all -fno-omit-frame-pointer -g)
add_link_options(-fsanitize=${KIMIRT_FUZZ_SANITIZERS})
if(TARGET kimirt_core)
  message(WARNING "kimirt_fuzz.cmake included after the layer libraries: they are built "
                  "without coverage instrumentation unless CMAKE_CXX_FLAGS carries it "
                  "(scripts/fuzz.sh does)")
endif()

function(kimirt_fuzz_target)
  cmake_parse_arguments(F "" "NAME;SOURCE" "LIBS" ${ARGN})
  if(NOT F_NAME OR NOT F_SOURCE)
    message(FATAL_ERROR "kimirt_fuzz_target(NAME <name> SOURCE <file> LIBS <libs...>)")
  endif()
  add_executable(${F_NAME} ${F_SOURCE})
  set(_warnings -Wall -Wextra -Werror)
  if(DEFINED KIMIRT_WARNINGS)
    set(_warnings ${KIMIRT_WARNINGS})  # kimirt_layer.cmake's list, as the layers use
  endif()
  target_compile_options(${F_NAME} PRIVATE ${_warnings} -fsanitize=fuzzer,${KIMIRT_FUZZ_SANITIZERS})
  target_link_options(${F_NAME} PRIVATE -fsanitize=fuzzer,${KIMIRT_FUZZ_SANITIZERS})
  target_link_libraries(${F_NAME} PRIVATE ${F_LIBS})
  set_target_properties(${F_NAME} PROPERTIES RUNTIME_OUTPUT_DIRECTORY "${CMAKE_BINARY_DIR}/fuzz")
  set_property(GLOBAL APPEND PROPERTY KIMIRT_FUZZ_TARGETS ${F_NAME})
endfunction()

function(kimirt_fuzz_all)
  file(GLOB _fuzz_sources CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/kimirt/*/*_fuzz.cpp")
  foreach(_src ${_fuzz_sources})
    get_filename_component(_name ${_src} NAME_WE)
    get_filename_component(_dir ${_src} DIRECTORY)
    get_filename_component(_layer ${_dir} NAME)
    if(NOT TARGET kimirt_${_layer})
      message(FATAL_ERROR "${_src}: no layer library kimirt_${_layer} to link against")
    endif()
    kimirt_fuzz_target(NAME ${_name} SOURCE ${_src} LIBS kimirt_${_layer})
  endforeach()
  get_property(_targets GLOBAL PROPERTY KIMIRT_FUZZ_TARGETS)
  message(STATUS "kimirt fuzz targets: ${_targets}")
endfunction()

if(NOT KIMIRT_FUZZ_NO_AUTO)
  cmake_language(DEFER CALL kimirt_fuzz_all)
endif()
