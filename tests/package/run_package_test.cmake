# The install as a user meets it. Installs this build into a scratch prefix, MOVES the prefix (the
# install must be relocatable), then from the moved prefix:
#   1. runs the installed tools (their RPATH must find libtributary);
#   2. builds and runs four consumers: a CMake project (find_package), a CMake project of C alone,
#      a C++ program compiled with pkg-config's flags, and a C program compiled with tributary-c's
#      flags;
#   3. checks that the shared library exports the public API only (no Boost, Asio, nlohmann, fmt or
#      internal symbols).
# Inputs: SOURCE_DIR, BUILD_DIR, WORK_DIR, GENERATOR, CXX, CC.
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})

function(run what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(rc)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "${what}: ok")
  set(run_out "${out}" PARENT_SCOPE)
endfunction()

run("cmake --install" ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/staging)
file(RENAME ${WORK_DIR}/staging ${WORK_DIR}/moved)
set(P ${WORK_DIR}/moved)
file(GLOB libdirs LIST_DIRECTORIES true ${P}/lib*)
list(GET libdirs 0 libdir)

# 1. The installed tools start from the moved prefix (no LD_LIBRARY_PATH).
run("installed tributary-info" ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${P}/bin/tributary-info)
if(NOT run_out MATCHES "tributary")
  message(FATAL_ERROR "installed tributary-info printed nothing recognisable:\n${run_out}")
endif()
run("installed tributary-bench" ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
    ${P}/bin/tributary-bench -b 1K -e 4K -n 2 -w 1 --backend reduction_to_one_device)
run("installed tributary-run" ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
    ${P}/bin/tributary-run -n 2 -- ${P}/bin/tributary-info)

# 2a. A CMake project: find_package(tributary).
run("configuring the CMake consumer" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer
    -B ${WORK_DIR}/cmake-consumer -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${P})
run("building the CMake consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/cmake-consumer)
foreach(spec reduction_to_one_device hierarchical_copy:num_packs=2)
  run("CMake consumer ${spec}" ${WORK_DIR}/cmake-consumer/consumer ${spec})
endforeach()

# 2a''. A project of C alone (no C++ compiler enabled) linking tributary::tributary for the C API.
file(MAKE_DIRECTORY ${WORK_DIR}/c-project)
file(WRITE ${WORK_DIR}/c-project/CMakeLists.txt "cmake_minimum_required(VERSION 3.20)
project(c_consumer C)
find_package(tributary REQUIRED)
add_executable(c_consumer ${SOURCE_DIR}/tests/package/consumer_c.c)
target_link_libraries(c_consumer PRIVATE tributary::tributary)
")
run("configuring the C-only CMake consumer" ${CMAKE_COMMAND} -S ${WORK_DIR}/c-project
    -B ${WORK_DIR}/c-project/build -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${P})
run("building the C-only CMake consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/c-project/build)
run("C-only CMake consumer" ${WORK_DIR}/c-project/build/c_consumer)

# 2a'. The same project against the static library, when the build made one.
if(EXISTS ${libdir}/libtributary.a)
  run("configuring the static CMake consumer" ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer
      -B ${WORK_DIR}/cmake-consumer-static -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${P}
      -DCONSUMER_STATIC=ON)
  run("building the static CMake consumer" ${CMAKE_COMMAND} --build ${WORK_DIR}/cmake-consumer-static)
  run("static CMake consumer" ${WORK_DIR}/cmake-consumer-static/consumer reduction_to_one_device)
  run("ldd of the static consumer" ldd ${WORK_DIR}/cmake-consumer-static/consumer)
  if(run_out MATCHES "libtributary")
    message(FATAL_ERROR "the static consumer still loads libtributary.so:\n${run_out}")
  endif()
else()
  message(STATUS "no libtributary.a in the install (TRIBUTARY_BUILD_STATIC=OFF): static consumer not built")
endif()

# 2b. A C++ program built with pkg-config's flags alone, as `g++ main.cc $(pkg-config ...)`.
set(ENV{PKG_CONFIG_PATH} ${libdir}/pkgconfig)
foreach(module tributary tributary-c)
  run("pkg-config ${module}" pkg-config --cflags --libs ${module})
  string(STRIP "${run_out}" flags)
  separate_arguments(flags_${module} UNIX_COMMAND "${flags}")
  if(NOT flags MATCHES "-I${P}/")
    message(FATAL_ERROR "pkg-config ${module} does not point into the moved prefix ${P}: ${flags}")
  endif()
endforeach()
run("compiling with pkg-config tributary" ${CXX} ${SOURCE_DIR}/tests/package/consumer/main.cc
    ${flags_tributary} -o ${WORK_DIR}/pkgconfig-consumer)
run("pkg-config consumer" ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
    ${WORK_DIR}/pkgconfig-consumer reduction_to_one_device)

# 2c. A C program of the C API, built with tributary-c's flags.
run("compiling the C consumer" ${CC} -std=c11 -Wall -Werror ${SOURCE_DIR}/tests/package/consumer_c.c
    ${flags_tributary-c} -o ${WORK_DIR}/c-consumer)
run("C consumer" ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH ${WORK_DIR}/c-consumer)

# 2d. The same C program linked statically with `pkg-config --static tributary-c` (its
# Libs.private: the C++ runtime and the libraries the archive's objects need), libtributary.a
# named for -ltributary so that the shared library beside it is not taken.
if(EXISTS ${libdir}/libtributary.a)
  run("pkg-config --static tributary-c" pkg-config --static --cflags --libs tributary-c)
  string(STRIP "${run_out}" flags)
  separate_arguments(static_flags UNIX_COMMAND "${flags}")
  list(TRANSFORM static_flags REPLACE "^-ltributary$" "${libdir}/libtributary.a")
  run("compiling the static C consumer" ${CC} -std=c11 -Wall -Werror
      ${SOURCE_DIR}/tests/package/consumer_c.c ${static_flags} -o ${WORK_DIR}/c-consumer-static)
  run("static C consumer" ${CMAKE_COMMAND} -E env --unset=LD_LIBRARY_PATH
      ${WORK_DIR}/c-consumer-static)
  run("ldd of the static C consumer" ldd ${WORK_DIR}/c-consumer-static)
  if(run_out MATCHES "libtributary")
    message(FATAL_ERROR "the static C consumer still loads libtributary.so:\n${run_out}")
  endif()
endif()

# 3. Exported symbols: the public API and the C API only.
file(GLOB sos ${libdir}/libtributary.so.*.*)
list(GET sos 0 so)
run("nm -D" nm -D --defined-only -C ${so})
string(REGEX MATCHALL "[^\n]+" symbols "${run_out}")
list(LENGTH symbols count)
set(leaks "")
foreach(sym IN LISTS symbols)
  if(sym MATCHES "boost::|asio::|nlohmann::|fmt::|gloo::|tributary::(algorithms|transports|backends|gpu|strategy_internal)::")
    list(APPEND leaks "${sym}")
  endif()
endforeach()
if(leaks)
  list(LENGTH leaks n)
  list(SUBLIST leaks 0 20 first)
  string(REPLACE ";" "\n" first "${first}")
  message(FATAL_ERROR "libtributary exports ${n} symbols that are not its public API, e.g.:\n${first}")
endif()
if(NOT run_out MATCHES "trib_all_reduce" OR NOT run_out MATCHES "tributary::BackendRegistry")
  message(FATAL_ERROR "libtributary does not export its public API (trib_all_reduce, BackendRegistry)")
endif()
message(STATUS "libtributary exports ${count} dynamic symbols, none of them internal")
