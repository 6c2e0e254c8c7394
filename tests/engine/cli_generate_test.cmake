# `xserv-cli generate` checked from outside: greedy ids for the embedded model's "ROMEO:" prompt
# must equal transformers' (tests/data/models/shakespeare/golden.json, case 0), printed by --ids
# as a JSON array on the last line of stdout, after the streamed text.
# Run as: cmake -DCLI=... -DMODEL=... -DGOLDEN=... -P cli_generate_test.cmake
execute_process(
  COMMAND ${CLI} generate -m ${MODEL} -p "ROMEO:" -n 32 --temperature 0 --ignore-eos --ids
          --device cpu --threads 2 --quiet
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "xserv-cli generate failed (${rc}): ${err}")
endif()
string(STRIP "${out}" out)
string(FIND "${out}" "\n" nl REVERSE)
math(EXPR start "${nl} + 1")
string(SUBSTRING "${out}" ${start} -1 last_line)
file(READ ${GOLDEN} golden)
string(JSON want GET "${golden}" cases 0 greedy_ids)
string(JSON want_prompt GET "${golden}" cases 0 prompt_text)
if(NOT want_prompt STREQUAL "ROMEO:")
  message(FATAL_ERROR "golden case 0 has prompt '${want_prompt}', expected 'ROMEO:'")
endif()
string(JSON n LENGTH "${want}")
string(JSON got_n LENGTH "${last_line}")
if(NOT n EQUAL got_n)
  message(FATAL_ERROR "got ${got_n} ids, expected ${n}: ${last_line}")
endif()
math(EXPR last "${n} - 1")
foreach(i RANGE ${last})
  string(JSON a GET "${last_line}" ${i})
  string(JSON b GET "${want}" ${i})
  if(NOT a EQUAL b)
    message(FATAL_ERROR "id ${i}: got ${a}, expected ${b}\ngot:  ${last_line}\nwant: ${want}")
  endif()
endforeach()
if(nl LESS 1)
  message(FATAL_ERROR "no streamed text before the ids line")
endif()
message(STATUS "xserv-cli generate: ${n} greedy ids match transformers")
