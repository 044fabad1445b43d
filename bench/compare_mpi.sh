#!/usr/bin/env bash
# Same-host all-reduce, tributary beside Open MPI, in one run: for each size in turn (interleaved, so
# that a change in the machine's load hits every line alike), float32 sum, N processes on this host.
# The lines, by --set:
#   shm (default)  ring (tributary's default: shared memory between same-host processes),
#                  ring -R 2 (the same on buffers from Buffer::allocate_shareable, registered:
#                  shared memory's direct path, as nccl-tests' -R 2 allocates with ncclMemAlloc),
#                  ring:slots (ring:shm_single_copy=off: no single-copy reads and writes of the
#                  peers' buffers), ring:net (ring:intra_host=net, TCP loopback), mpi vader (--mca pml ob1 --mca btl
#                  vader,self: Open MPI's shared memory), mpi ucx sm (--mca pml ucx, UCX_TLS=sm,self;
#                  Open MPI 4.1 passes over UCX without an RDMA device unless pml_ucx_tls/devices
#                  say "any")
#   tcp            ring:net, ucx:tls=tcp, mpi tcp (--mca btl tcp,self), mpi ucx tcp (UCX_TLS=tcp,self)
#   ucx            ucx:tls=sm, ucx:tls=tcp, mpi ucx sm, mpi ucx tcp
# Prints the in-place figures (time in us for sizes up to 4 KiB, busbw in GB/s above), then the
# out-of-place ones. With --repeat K every size is measured K times over, each round running the
# lines in a rotated order, and each cell gives the median of the K figures with their range
# ("3.95 (2.10-4.02)"): on a shared VM one run of a line can be 2x off the next.
#
#   bench/compare_mpi.sh [--set shm|tcp|ucx] [--np N] [--sizes 4K,64K,1M,16M,256M] [-n ITERS]
#                        [--repeat K] [--build DIR]
#
# Installs Open MPI (openmpi-bin, libopenmpi-dev) and builds tributary in Release first when needed.
set -euo pipefail
cd "$(dirname "$0")/.."

np=2
set=shm
sizes=4K,64K,1M,16M,256M
iters=200
repeat=1
build=${TRIBUTARY_BUILD_DIR:-build}
while [ $# -gt 0 ]; do
  case "$1" in
    --np) np=$2; shift 2 ;;
    --set) set=$2; shift 2 ;;
    --sizes) sizes=$2; shift 2 ;;
    -n) iters=$2; shift 2 ;;
    --repeat) repeat=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    *) echo "compare_mpi: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
case "$repeat" in ''|*[!0-9]*|0) echo "compare_mpi: --repeat takes a positive number, not '$repeat'" >&2; exit 2 ;; esac

scripts/install-deps.sh
if ! command -v mpirun >/dev/null ||
   ! dpkg-query -W -f='${Status}' libopenmpi-dev 2>/dev/null | grep -q "install ok installed"; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  echo "compare_mpi: installing Open MPI (openmpi-bin libopenmpi-dev)" >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    openmpi-bin libopenmpi-dev >/dev/null
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DTRIBUTARY_WERROR=OFF >/dev/null
cmake --build "$build" -j "$(nproc)" --target tributary-bench tributary-run mpi-allreduce-bench >/dev/null

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpi=(mpirun -np "$np" --oversubscribe)

# Iterations for a size: fewer for the largest, so that a run stays within minutes.
n_for() {
  local bytes; bytes=$(numfmt --from=iec "$1")
  if [ "$bytes" -ge $((64 << 20)) ]; then echo $(( iters / 10 > 5 ? iters / 10 : 5 ));
  elif [ "$bytes" -ge $((4 << 20)) ]; then echo $(( iters / 4 > 5 ? iters / 4 : 5 ));
  else echo "$iters"; fi
}

# "oop_time oop_busbw ip_time ip_busbw" of one size, from each program's table ("" if it failed).
ours() {  # spec size [tributary-bench flags]
  local n extra=(); n=$(n_for "$2")
  [ -n "${3:-}" ] && read -r -a extra <<< "$3"
  # nccl-tests' columns: size count type redop root, then time algbw busbw #wrong out of place
  # ($6 $7 $8 $9) and in place ($10 $11 $12 $13).
  "$build/bench/tributary-bench" --np "$np" --replicas 1 --backend "$1" --sizes "$2" -n "$n" "${extra[@]}" \
    -w $(( n / 4 + 1 )) -q | awk '!/^#/ && NF >= 13 && $1 ~ /^[0-9]+$/ { print $6, $8, $10, $12; exit }' || true
}
theirs() {  # size, then mpirun options
  local size=$1 n; shift
  n=$(n_for "$size")
  "${mpi[@]}" "$@" "$build/bench/mpi-allreduce-bench" --sizes "$size" -n "$n" -w $(( n / 4 + 1 )) \
    2>/dev/null | awk 'NF == 7 && $1 ~ /^[0-9]+$/ { print $3, $4, $5, $6; if ($7 != 0) print "WRONG" > "/dev/stderr"; exit }' || true
}

mpi_ucx=(--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any)
# Each line: "name|ours|spec[|tributary-bench flags]" or "name|theirs|mpirun options".
case "$set" in
  shm) lines=("ring|ours|ring" "ring -R 2|ours|ring|-R 2" "ring:slots|ours|ring:shm_single_copy=off"
              "ring:net|ours|ring:intra_host=net"
              "mpi vader|theirs|--mca pml ob1 --mca btl vader,self"
              "mpi ucx sm|theirs|${mpi_ucx[*]} -x UCX_TLS=sm,self") ;;
  tcp) lines=("ring:net|ours|ring:intra_host=net" "ucx:tcp|ours|ucx:tls=tcp"
              "mpi tcp|theirs|--mca pml ob1 --mca btl tcp,self"
              "mpi ucx tcp|theirs|${mpi_ucx[*]} -x UCX_TLS=tcp,self") ;;
  ucx) lines=("ucx:sm|ours|ucx:tls=sm" "ucx:tcp|ours|ucx:tls=tcp"
              "mpi ucx sm|theirs|${mpi_ucx[*]} -x UCX_TLS=sm,self"
              "mpi ucx tcp|theirs|${mpi_ucx[*]} -x UCX_TLS=tcp,self") ;;
  *) echo "compare_mpi: unknown set '$set' (shm, tcp or ucx)" >&2; exit 2 ;;
esac
names=()
for l in "${lines[@]}"; do names+=("${l%%|*}"); done
declare -A figures
IFS=, read -r -a list <<< "$sizes"
nlines=${#lines[@]}
for s in "${list[@]}"; do
  for (( r = 0; r < repeat; r++ )); do
    for (( j = 0; j < nlines; j++ )); do
      k=$(( (j + r) % nlines ))  # round r starts with line r: no line always runs first
      IFS='|' read -r _ kind what extra <<< "${lines[$k]}"
      if [ "$kind" = ours ]; then
        figures[$s,$k,$r]=$(ours "$what" "$s" "$extra")
      else
        read -r -a opts <<< "$what"
        figures[$s,$k,$r]=$(theirs "$s" "${opts[@]}")
      fi
    done
  done
  echo "compare_mpi: $s done" >&2
done

# The cell of size $1, line $2, field $3 (0-3): the figure, or with several rounds "median
# (min-max)" over the rounds that produced one; "-" when none did.
cell() {
  local vals=() r f
  for (( r = 0; r < repeat; r++ )); do
    read -r -a f <<< "${figures[$1,$2,$r]:-}"
    [ -n "${f[$3]:-}" ] && vals+=("${f[$3]}")
  done
  [ ${#vals[@]} -eq 0 ] && { echo -; return; }
  printf '%s\n' "${vals[@]}" | sort -g | awk '{ v[NR] = $1 } END {
    m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
    if (NR == 1) print v[1]; else printf "%.3g (%.3g-%.3g)\n", m, v[1], v[NR] }'
}

table() {  # title, field offset (0 = out of place, 2 = in place)
  local width=14 runs=""
  [ "$repeat" -gt 1 ] && { width=22; runs=", median (range) of $repeat runs"; }
  echo "# $1, float32 sum, $np processes on $(hostname): time (us) up to 4 KiB, busbw (GB/s)" \
       "above$runs"
  printf '%10s' size
  for n in "${names[@]}"; do printf "%${width}s" "$n"; done
  echo
  for s in "${list[@]}"; do
    printf '%10s' "$s"
    bytes=$(numfmt --from=iec "$s" 2>/dev/null || echo 0)
    for k in "${!lines[@]}"; do
      if [ "$bytes" -le 4096 ]; then v=$(cell "$s" "$k" "$2"); u=us
      else v=$(cell "$s" "$k" $(( $2 + 1 ))); u=; fi
      [ "$v" = - ] && u=
      printf "%${width}s" "$v$u"
    done
    echo
  done
}
table "in place" 2
echo
table "out of place" 0
