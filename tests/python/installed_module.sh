#!/bin/sh
# The Python module as users install it: `cmake --install` into a prefix that is then moved (the
# extension finds libtributary through its relative RPATH), and into a virtual environment.
#   installed_module.sh BUILD_DIR PYTHON
set -eu
build=$1
python=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

mkdir "$tmp/elsewhere"
check() {  # check PYTHON: imports the installed package and all-reduces with it, from a directory
           # that holds no prefix (a relative path in a .pth file would resolve from the install's)
  (cd "$tmp/elsewhere" && env -u PYTHONPATH "$@" -c "
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

# As the README writes it: a relative prefix, from the directory that holds the environment (the
# .pth file the install writes there must hold an absolute path: Python reads a relative one
# against site-packages).
build=$(realpath "$build")
"$python" -m venv --system-site-packages "$tmp/venv"  # NumPy from the system
(cd "$tmp" && cmake --install "$build" --prefix venv) > "$tmp/install.log" 2>&1 || { cat "$tmp/install.log"; exit 1; }
# Debian's own Python reads dist-packages in a virtual environment, other builds of Python only
# site-packages: there the .pth file is what finds the package, so check what it says.
if find "$tmp/venv" -path '*/dist-packages/tributary/__init__.py' | grep -q .; then
  pth=$(find "$tmp/venv" -name tributary.pth)
  [ -n "$pth" ] || { echo "no tributary.pth in the virtual environment's site-packages"; exit 1; }
  line=$(cat "$pth")
  case $line in
    /*) [ -f "$line/tributary/__init__.py" ] || { echo "$pth names $line, which has no package"; exit 1; } ;;
    *) echo "$pth holds a relative path ($line): Python reads it against site-packages"; exit 1 ;;
  esac
fi
check "$tmp/venv/bin/python"
