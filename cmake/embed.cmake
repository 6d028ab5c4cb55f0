# Writes IN's text as a C++ string constant named VAR into OUT. A raw string
# literal keeps UTF-8 bytes intact (a brace list of hex bytes would narrow
# bytes >= 0x80 into char, which GCC rejects).
file(READ ${IN} content)
string(FIND "${content}" ")kforge_embed\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} contains the raw-string delimiter )kforge_embed\"")
endif()
file(WRITE ${OUT} "namespace kforge::embedded {\nextern const char ${VAR}[];\nconst char ${VAR}[] = R\"kforge_embed(${content})kforge_embed\";\n}\n")
