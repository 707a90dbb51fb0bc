# imegen build-system hook.
#
#   include(<imegen>/imegen/cmake/imegen.cmake)     # `imegen cmake-snippet` prints this line
#   imegen_generate(<target> SPEC <spec.imegen> [OUTPUT_DIR <dir>] [DEFINE <macro>] [ORT_GLUE] [ORT <version>])
#
# Runs `imegen generate` at build time (again whenever the spec, imegen's templates or its Python
# sources change), adds the generated C files to <target>, each with the -march it needs, and adds
# the output directory (default <binary dir>/imegen_generated) to <target>'s include path. When the spec has abi=mlas kernels it also
# defines <macro> (default MLAS_USE_IMEGEN_QNBIT) on <target>, and with ORT_GLUE adds the C++ file
# that fills ORT's MLAS_QNBIT_GEMM_DISPATCH (it includes ORT's mlasi.h/qnbitgemm.h), with the signatures
# of ORT <version> (`imegen generate --mlas-pin`: main or 1.21; default main).
# The interpreter with imegen installed: IMEGEN_PYTHON, else Python3_EXECUTABLE / find_package(Python3).

get_filename_component(IMEGEN_PACKAGE_DIR "${CMAKE_CURRENT_LIST_DIR}/.." ABSOLUTE)
# templates/ and grammar/: inside the package when installed from a wheel, at the repository root in a checkout.
if(EXISTS "${IMEGEN_PACKAGE_DIR}/templates")
  set(IMEGEN_DATA_DIR "${IMEGEN_PACKAGE_DIR}")
else()
  get_filename_component(IMEGEN_DATA_DIR "${IMEGEN_PACKAGE_DIR}/.." ABSOLUTE)
endif()

function(imegen_generate target)
  cmake_parse_arguments(ARG "ORT_GLUE" "SPEC;OUTPUT_DIR;DEFINE;ORT" "" ${ARGN})
  if(NOT ARG_SPEC)
    message(FATAL_ERROR "imegen_generate(${target}): SPEC <file> is required")
  endif()
  get_filename_component(spec "${ARG_SPEC}" ABSOLUTE)
  if(NOT ARG_OUTPUT_DIR)
    set(ARG_OUTPUT_DIR "${CMAKE_CURRENT_BINARY_DIR}/imegen_generated")
  endif()
  if(NOT ARG_ORT)
    set(ARG_ORT main)
  endif()
  if(NOT ARG_DEFINE)
    set(ARG_DEFINE MLAS_USE_IMEGEN_QNBIT)
  endif()
  if(NOT IMEGEN_PYTHON)
    if(NOT Python3_EXECUTABLE)
      find_package(Python3 REQUIRED COMPONENTS Interpreter)
    endif()
    set(IMEGEN_PYTHON "${Python3_EXECUTABLE}")
  endif()

  # The file list is known at configure time; a spec edit re-runs configure (kernels may be renamed).
  # Run from the directory holding the imegen package, so `-m imegen` cannot pick up a
  # same-named directory from the build tree.
  get_filename_component(package_parent "${IMEGEN_PACKAGE_DIR}/.." ABSOLUTE)
  execute_process(COMMAND "${IMEGEN_PYTHON}" -m imegen outputs "${spec}" --mlas-pin "${ARG_ORT}" WORKING_DIRECTORY "${package_parent}"
                  OUTPUT_VARIABLE listing ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "imegen: ${err}")
  endif()
  set_property(DIRECTORY APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS "${spec}")

  set(outputs "")
  set(sources "")
  set(has_dispatch FALSE)
  string(REPLACE "\n" ";" lines "${listing}")
  foreach(line IN LISTS lines)
    if(line STREQUAL "")
      continue()
    endif()
    string(REPLACE "\t" ";" fields "${line}")
    list(GET fields 0 name)
    set(path "${ARG_OUTPUT_DIR}/${name}")
    list(APPEND outputs "${path}")
    list(LENGTH fields nfields)
    if(nfields GREATER 1)  # a C file, with its -march
      list(GET fields 1 march)
      list(APPEND sources "${path}")
      set_source_files_properties("${path}" PROPERTIES COMPILE_OPTIONS "-march=${march}")
    endif()
    if(name MATCHES "_dispatch\\.c$")
      set(has_dispatch TRUE)
    elseif(name MATCHES "_mlas_dispatch\\.cpp$" AND ARG_ORT_GLUE)
      list(APPEND sources "${path}")
    endif()
  endforeach()

  file(GLOB templates "${IMEGEN_DATA_DIR}/templates/*.j2")
  # Every module of the package (imegen/ort/ renders the MLAS glue) and the grammar.
  file(GLOB_RECURSE generator "${IMEGEN_PACKAGE_DIR}/*.py")
  file(GLOB grammar "${IMEGEN_DATA_DIR}/grammar/*.lark")
  list(APPEND generator ${grammar})
  add_custom_command(
    OUTPUT ${outputs}
    COMMAND "${IMEGEN_PYTHON}" -m imegen generate "${spec}" --mlas-pin "${ARG_ORT}" -o "${ARG_OUTPUT_DIR}"
    DEPENDS "${spec}" ${templates} ${generator}
    WORKING_DIRECTORY "${package_parent}"
    COMMENT "imegen: generating kernels from ${ARG_SPEC}"
    VERBATIM)
  target_sources(${target} PRIVATE ${sources})
  target_include_directories(${target} PRIVATE "${ARG_OUTPUT_DIR}")
  if(has_dispatch)
    target_compile_definitions(${target} PRIVATE ${ARG_DEFINE})
  endif()
endfunction()
