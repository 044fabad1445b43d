# Sourced by the build scripts. ccache keyed on paths relative to the checkout, so a fresh clone
# (CI clones anew every time) hits what earlier clones compiled; room for the several build
# flavours (test, release, sanitizers). Values already in the environment win.
export CCACHE_BASEDIR=${CCACHE_BASEDIR:-$PWD}
export CCACHE_NOHASHDIR=${CCACHE_NOHASHDIR:-1}
export CCACHE_MAXSIZE=${CCACHE_MAXSIZE:-15G}
