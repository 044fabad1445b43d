# cmake -DBENCH=<tributary-bench> -DDIR=<folder> -P bench_outputs_test.cmake
#
# tributary-bench as users run it with every output format: two backends, every result checked,
# then the files themselves read back. The run must exit 0 and report no wrong value; the JSON must
# hold both backends with a row per size and placement, each with wrong = 0; the CSV the same rows
# under its header; the plot must be a PNG. Old files are removed first, so a run that writes
# nothing cannot pass on a previous run's files.
cmake_minimum_required(VERSION 3.19)  # string(JSON)
set(json ${DIR}/bench.json)
set(csv ${DIR}/bench.csv)
set(png ${DIR}/bench.png)
file(REMOVE ${json} ${csv} ${png})
execute_process(
  COMMAND ${BENCH} -b 4 -e 256K -f 4 -n 3 -w 1 -q --replicas 3 --backend reduction_to_one_device
          --backend hierarchical_copy:group_size=2 --json ${json} --csv ${csv} --plot ${png}
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
message("${out}${err}")
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "tributary-bench exited ${rc}")
endif()
if(NOT out MATCHES "Out of bounds values : 0 OK.*Out of bounds values : 0 OK")
  message(FATAL_ERROR "two checked tables with no wrong value were expected")
endif()

# 9 sizes (4 B to 256 KiB, x4), out of place and in place, for each of the 2 backends.
set(rows_per_backend 18)
foreach(f ${json} ${csv} ${png})
  if(NOT EXISTS ${f})
    message(FATAL_ERROR "${f} was not written")
  endif()
endforeach()

file(READ ${json} doc)
string(JSON backends ERROR_VARIABLE bad LENGTH "${doc}" backends)
if(bad)
  message(FATAL_ERROR "${json} is not the bench's JSON: ${bad}")
endif()
if(NOT backends EQUAL 2)
  message(FATAL_ERROR "${json} holds ${backends} backends, not 2")
endif()
math(EXPR last_backend "${backends} - 1")
foreach(b RANGE ${last_backend})
  string(JSON rows LENGTH "${doc}" backends ${b} rows)
  if(NOT rows EQUAL rows_per_backend)
    message(FATAL_ERROR "${json}: backend ${b} has ${rows} rows, not ${rows_per_backend}")
  endif()
  math(EXPR last_row "${rows} - 1")
  foreach(r RANGE ${last_row})
    string(JSON wrong GET "${doc}" backends ${b} rows ${r} wrong)
    if(NOT wrong EQUAL 0)
      message(FATAL_ERROR "${json}: backend ${b} row ${r} has ${wrong} wrong values")
    endif()
  endforeach()
endforeach()

file(STRINGS ${csv} lines)
list(LENGTH lines n)
math(EXPR expected "2 * ${rows_per_backend} + 1")
if(NOT n EQUAL expected)
  message(FATAL_ERROR "${csv} has ${n} lines, not ${expected} (a header and a line per row)")
endif()
list(POP_FRONT lines header)
if(NOT header MATCHES "^backend,processes,replicas,dtype,op,bytes,count,in_place,iters,time_us,algbw_gbps,busbw_gbps,wrong,")
  message(FATAL_ERROR "${csv}: unexpected header '${header}'")
endif()
foreach(line ${lines})
  # The backend's spec, quoted, may hold commas: the other fields follow it, wrong the 12th.
  string(REGEX REPLACE "^\"[^\"]*\"," "" rest "${line}")
  string(REPLACE "," ";" fields "${rest}")
  list(LENGTH fields nfields)
  if(rest STREQUAL line OR NOT nfields EQUAL 14)
    message(FATAL_ERROR "${csv}: a row of another shape: ${line}")
  endif()
  list(GET fields 11 wrong)
  if(NOT wrong STREQUAL "0")
    message(FATAL_ERROR "${csv}: a row with ${wrong} wrong values: ${line}")
  endif()
endforeach()

file(READ ${png} magic LIMIT 8 HEX)
if(NOT magic STREQUAL "89504e470d0a1a0a")
  message(FATAL_ERROR "${png} is not a PNG (it begins ${magic})")
endif()
message("bench outputs: JSON, CSV and PNG written and read back")
