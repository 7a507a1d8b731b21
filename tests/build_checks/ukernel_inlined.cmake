# Fails when a GEMM micro-kernel helper that ukernel_impl.h forces inline (multiply_accumulate*,
# finish_tile) was emitted out of line in LIBRARY: its caller's accumulators then go through the
# stack on every FMA (the implicit GEMM ran 3x slower so, and every value test still passed).
# Run as: cmake -DNM=<nm> -DLIBRARY=<libsparsecol_kernels.a> -P ukernel_inlined.cmake
execute_process(COMMAND "${NM}" -C "${LIBRARY}" OUTPUT_VARIABLE symbols RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  message(FATAL_ERROR "${NM} -C ${LIBRARY} failed (${status})")
endif()
string(REGEX MATCH "gemm_avx512\\.cc\\.o:" has_avx512 "${symbols}")
if(NOT has_avx512)
  message(FATAL_ERROR "${LIBRARY} has no gemm_avx512.cc.o member: nothing was checked")
endif()
string(REGEX MATCHALL "[^\n]* [tT] [^\n]*(multiply_accumulate|finish_tile)[^\n]*" out_of_line
       "${symbols}")
if(out_of_line)
  list(LENGTH out_of_line count)
  list(GET out_of_line 0 first)
  message(FATAL_ERROR "${count} micro-kernel helpers emitted out of line, e.g.\n${first}")
endif()
message(STATUS "every multiply_accumulate* and finish_tile of the micro-kernels is inlined")
