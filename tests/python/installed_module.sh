#!/bin/sh
# The Python module as users install it: `cmake --install` into a prefix that is then moved (the
# extension finds libtributary through its relative RPATH), and into a virtual environment.
#   installed_module.sh BUILD_DIR PYTHON
set -eu
build=$1
python=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

check() {  # check PYTHON: imports the installed package and all-reduces with it
  (cd "$tmp" && env -u PYTHONPATH "$@" -c "
import numpy as np, os, sys, tributary
where = os.path.realpath(tributary.__file__)
assert where.startswith(os.path.realpath(sys.argv[1])), where
ops = tributary.backend('hierarchical_copy', devices=2)
xs = [np.ones(5, np.float32), np.full(5, 2, np.float32)]
ops.all_reduce(xs)
assert (xs[0] == 3).all() and (xs[1] == 3).all()
print('installed module works from', os.path.dirname(where))
" "$tmp")
}

cmake --install "$build" --prefix "$tmp/prefix" > "$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; exit 1; }
mv "$tmp/prefix" "$tmp/moved"
site=$(dirname "$(dirname "$(find "$tmp/moved" -path '*/tributary/_tributary*.so')")")
check env PYTHONPATH="$site" "$python"

"$python" -m venv --system-site-packages "$tmp/venv"  # NumPy from the system
cmake --install "$build" --prefix "$tmp/venv" > "$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; exit 1; }
check "$tmp/venv/bin/python"
