# mncl_add_plugin(<name> SOURCES <files>...) for a backend plugin built outside MNCL's tree,
# against an installed MNCL (find_package(mncl CONFIG) includes this file):
#   - a MODULE library libmncl-<name>.so (the loader takes <name> from the file name);
#   - compiled against mncl::abi and the C++17 plugin kit (mncl::plugin_kit);
#   - exporting only its mncl_plugin_vN tables (hidden visibility, and the version script
#     plugin.map installed beside this file: -fvisibility=hidden alone leaves the C++ library's
#     weak symbols exported), with every symbol resolved at link time (--no-undefined).
# Put the file in a folder of MNCL_PLUGIN_PATH (or <libdir>/mncl/plugins) and check it with
# mncl-info (mncl_INFO_EXECUTABLE). Inside MNCL's own tree, the root CMakeLists.txt defines the
# function of the same name for the built-in plugins.
set_property(GLOBAL PROPERTY MNCL_PLUGIN_MAP "${CMAKE_CURRENT_LIST_DIR}/plugin.map")

function(mncl_add_plugin name)
  cmake_parse_arguments(ARG "" "" "SOURCES" ${ARGN})
  if(NOT ARG_SOURCES)
    message(FATAL_ERROR "mncl_add_plugin(${name}): give its SOURCES")
  endif()
  get_property(map GLOBAL PROPERTY MNCL_PLUGIN_MAP)
  set(target mncl-${name})
  add_library(${target} MODULE ${ARG_SOURCES})
  target_link_libraries(${target} PRIVATE mncl::plugin_kit)
  set_target_properties(${target} PROPERTIES PREFIX "lib" OUTPUT_NAME mncl-${name}
    C_VISIBILITY_PRESET hidden CXX_VISIBILITY_PRESET hidden VISIBILITY_INLINES_HIDDEN ON)
  target_link_options(${target} PRIVATE
    "LINKER:--version-script=${map}" "LINKER:--no-undefined")
endfunction()
