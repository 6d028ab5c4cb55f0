# Writes IN's bytes as a C++ string constant named VAR into OUT.
file(READ ${IN} content HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${content}")
file(WRITE ${OUT} "namespace kforge::embedded {\nextern const char ${VAR}[];\nconst char ${VAR}[] = {${bytes} 0x00};\n}\n")
