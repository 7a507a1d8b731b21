# cmake -DEXAMPLE=embed.cc -DREADME=README.md -P check_readme.cmake
# Fails unless README contains, verbatim, the lines of EXAMPLE between its two "// [readme]"
# markers (with the markers' indentation removed).
file(READ ${EXAMPLE} example)
file(READ ${README} readme)
set(marker "// [readme]\n")
string(FIND "${example}" "${marker}" first)
string(FIND "${example}" "${marker}" last REVERSE)
if(first EQUAL -1 OR first EQUAL last)
  message(FATAL_ERROR "${EXAMPLE}: expected two '// [readme]' marker lines")
endif()
string(LENGTH "${marker}" marker_length)
math(EXPR begin "${first} + ${marker_length}")
# The indentation of the second marker is the snippet's indentation.
string(SUBSTRING "${example}" 0 ${last} before_last)
string(REGEX MATCH "[ ]*$" indent "${before_last}")
string(LENGTH "${indent}" indent_length)
math(EXPR length "${last} - ${indent_length} - ${begin}")
string(SUBSTRING "${example}" ${begin} ${length} snippet)
string(REGEX REPLACE "(^|\n)${indent}" "\\1" snippet "${snippet}")
string(FIND "${readme}" "${snippet}" found)
if(found EQUAL -1)
  message(FATAL_ERROR "${README} does not contain the example of ${EXAMPLE} verbatim; "
                      "expected these lines:\n${snippet}")
endif()
message(STATUS "README matches ${EXAMPLE}")
