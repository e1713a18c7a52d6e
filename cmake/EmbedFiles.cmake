# hetpar_embed_files(OUTPUT out.cpp NAMESPACE ns FUNCTION fn FILES a.json b.json ...)
# Generates out.cpp defining
#   std::span<const hetpar::EmbeddedFile> ns::fn();
# holding each file's stem and text, so the shipped model zoo and hardware profiles are
# compiled into the binary (it runs from any directory). Regenerated when a file changes.
set(HETPAR_EMBED_SCRIPT "${CMAKE_CURRENT_LIST_DIR}/embed_files_script.cmake")

function(hetpar_embed_files)
  cmake_parse_arguments(E "" "OUTPUT;NAMESPACE;FUNCTION" "FILES" ${ARGN})
  add_custom_command(
    OUTPUT "${E_OUTPUT}"
    COMMAND ${CMAKE_COMMAND} -DOUT=${E_OUTPUT} -DNS=${E_NAMESPACE} -DFN=${E_FUNCTION}
            "-DFILES=${E_FILES}" -P "${HETPAR_EMBED_SCRIPT}"
    DEPENDS ${E_FILES} "${HETPAR_EMBED_SCRIPT}"
    COMMENT "Embedding ${E_FUNCTION} data"
    VERBATIM)
endfunction()
