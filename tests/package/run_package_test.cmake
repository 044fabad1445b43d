# Installs this build into a scratch prefix, then configures, builds and runs tests/package/consumer
# against it with find_package(tributary), as a separate project would.
file(REMOVE_RECURSE ${WORK_DIR})
execute_process(COMMAND ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK_DIR}/prefix
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "cmake --install failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/tests/package/consumer -B ${WORK_DIR}/build
                        -G ${GENERATOR} -DCMAKE_PREFIX_PATH=${WORK_DIR}/prefix
                RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "configuring the consumer project failed (${rc})")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE rc)
if(rc)
  message(FATAL_ERROR "building the consumer project failed (${rc})")
endif()
foreach(spec reduction_to_one_device hierarchical_copy:num_packs=2)
  execute_process(COMMAND ${WORK_DIR}/build/consumer ${spec} RESULT_VARIABLE rc)
  if(rc)
    message(FATAL_ERROR "consumer ${spec} failed (${rc})")
  endif()
endforeach()
# pkg-config sees the same library.
execute_process(COMMAND ${CMAKE_COMMAND} -E env PKG_CONFIG_PATH=${WORK_DIR}/prefix/lib/pkgconfig
                        pkg-config --cflags --libs tributary
                RESULT_VARIABLE rc OUTPUT_VARIABLE out)
if(rc OR NOT out MATCHES "-ltributary")
  message(FATAL_ERROR "pkg-config does not find tributary in the install prefix (${rc}): ${out}")
endif()
