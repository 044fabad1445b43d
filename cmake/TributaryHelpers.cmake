# Helpers shared by every tributary CMakeLists.

# tributary_dependency_option(NAME DOC): a cache variable TRIBUTARY_WITH_<NAME> taking AUTO, ON or OFF.
function(tributary_dependency_option name doc)
  set(TRIBUTARY_WITH_${name} AUTO CACHE STRING "${doc}: AUTO (use if found), ON (required), OFF")
  set_property(CACHE TRIBUTARY_WITH_${name} PROPERTY STRINGS AUTO ON OFF)
  string(TOUPPER "${TRIBUTARY_WITH_${name}}" _v)
  if(NOT _v MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "TRIBUTARY_WITH_${name}=${TRIBUTARY_WITH_${name}}: expected AUTO, ON or OFF")
  endif()
  set(TRIBUTARY_WITH_${name} ${_v} PARENT_SCOPE)
  set(TRIBUTARY_HAVE_${name} FALSE PARENT_SCOPE)
endfunction()

# tributary_resolve_dependency(NAME FOUND_VAR WHAT): sets TRIBUTARY_HAVE_<NAME>, failing when ON and missing.
macro(tributary_resolve_dependency name found_var what)
  if(${found_var})
    set(TRIBUTARY_HAVE_${name} TRUE)
  elseif(TRIBUTARY_WITH_${name} STREQUAL "ON")
    message(FATAL_ERROR "TRIBUTARY_WITH_${name}=ON but ${what} was not found; "
                        "install it or configure with -DTRIBUTARY_WITH_${name}=AUTO")
  else()
    set(TRIBUTARY_HAVE_${name} FALSE)
  endif()
endmacro()

# tributary_warnings(TARGET): the project's warning flags.
function(tributary_warnings target)
  # Designated initializers that leave members to their defaults are intended.
  target_compile_options(${target} PRIVATE
    "$<$<COMPILE_LANGUAGE:C,CXX>:-Wall;-Wextra;-Wpedantic;-Wno-missing-field-initializers>")
  # nvcc: the host compiler's warnings on the host side of .cu files, nvcc's own on the device side.
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-missing-field-initializers>)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
    # GCC 12 reports false -Wrestrict positives inside std::string at -O3 (GCC bug 105329).
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wno-restrict>)
  endif()
  if(TRIBUTARY_WERROR)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:C,CXX>:-Werror>
                                             $<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>)
  endif()
  if(TRIBUTARY_SANITIZE)
    # Every report fails the run: UBSan would otherwise print and carry on.
    target_compile_options(${target} PRIVATE
      "$<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${TRIBUTARY_SANITIZE};-fno-omit-frame-pointer;-fno-sanitize-recover=all>")
    target_link_options(${target} PRIVATE -fsanitize=${TRIBUTARY_SANITIZE})
  endif()
endfunction()

# tributary_add_backend(NAME SOURCES...): a backend folder's static library, registered by name.
function(tributary_add_backend name)
  add_library(tributary_backend_${name} OBJECT ${ARGN})
  target_link_libraries(tributary_backend_${name} PUBLIC tributary_headers
    PRIVATE tributary_core tributary_algorithms)
  target_include_directories(tributary_backend_${name} PRIVATE ${PROJECT_SOURCE_DIR})
  tributary_warnings(tributary_backend_${name})
  set_property(GLOBAL APPEND PROPERTY TRIBUTARY_BACKEND_TARGETS tributary_backend_${name})
  set_property(GLOBAL APPEND PROPERTY TRIBUTARY_BACKEND_NAMES ${name})
endfunction()
