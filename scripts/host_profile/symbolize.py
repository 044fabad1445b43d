#!/usr/bin/env python3
"""Per-thread profiles from sampler.cc's output (see there).

  scripts/host_profile/symbolize.py PROFILE [--binary NAME=PATH ...] [--libc PATH] [--top N]
                                    [--callers REGEX]

PROFILE is a $SAMPLER_OUT.<pid> file. Frames in a binary named with --binary (its file name as the
process mapped it, e.g. libtributary.so.0=build-test/libtributary.so.0.1.0) are named with
addr2line against that unstripped copy; frames in libc are named by the nearest exported symbol of
--libc (a copy of the machine's own libc.so.6: internal functions such as malloc's show as their
exported neighbour); other libraries by file name. For each of the busiest threads it prints the
leaf functions and the inclusive ones, in percent of that thread's samples.
"""
import argparse
import bisect
import collections
import os
import re
import subprocess


def load(path):
    samples, maps = [], []
    with open(path) as f:
        for line in f:
            if line.startswith('S '):
                p = line.split()
                samples.append((int(p[1]), [int(x, 16) for x in p[2:]]))
            elif line.startswith('M '):
                p = line[2:].split()
                if len(p) >= 6 and 'x' in p[1]:
                    lo, hi = (int(x, 16) for x in p[0].split('-'))
                    maps.append((lo, hi, int(p[2], 16), p[5]))
    maps.sort()
    return samples, maps


def load_segments(path, cache={}):
    """(file offset, vaddr, size) of the PT_LOAD segments of an ELF file."""
    if path not in cache:
        out = subprocess.run(['readelf', '-lW', path], capture_output=True, text=True).stdout
        cache[path] = [(int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16))
                       for m in re.finditer(r'LOAD\s+(0x[0-9a-f]+)\s+(0x[0-9a-f]+)\s+0x[0-9a-f]+'
                                            r'\s+(0x[0-9a-f]+)', out)]
    return cache[path]


def vaddr(path, offset):
    for off, va, size in load_segments(path):
        if off <= offset < off + size:
            return offset - off + va
    return offset


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('profile')
    ap.add_argument('--binary', action='append', default=[])
    ap.add_argument('--libc')
    ap.add_argument('--top', type=int, default=30)
    ap.add_argument('--callers', metavar='REGEX',
                    help='also, per thread: for the samples with a frame matching REGEX, the '
                         'nearest frame below it in a --binary (which of our calls led there)')
    args = ap.parse_args()
    local = dict(b.split('=', 1) for b in args.binary)
    samples, maps = load(args.profile)
    starts = [m[0] for m in maps]

    def locate(pc):
        i = bisect.bisect_right(starts, pc) - 1
        if i < 0 or pc >= maps[i][1]:
            return ('?', 0)
        lo, _, off, f = maps[i]
        return (os.path.basename(f), pc - lo + off)

    # Frames past the leaf are return addresses: look up the call instruction (pc - 1). The first
    # two frames are the signal handler and the kernel's trampoline.
    stacks = [(tid, [locate(pc - (1 if k > 2 else 0)) for k, pc in enumerate(pcs)][2:])
              for tid, pcs in samples]
    names = {}
    wanted = collections.defaultdict(set)
    for _, frames in stacks:
        for lib, off in frames:
            if lib in local:
                wanted[lib].add(off)
    for lib, offs in wanted.items():
        offs = sorted(offs)
        out = subprocess.run(['addr2line', '-f', '-C', '-e', local[lib]] +
                             [hex(vaddr(local[lib], o)) for o in offs],
                             capture_output=True, text=True).stdout.split('\n')
        for i, o in enumerate(offs):
            names[(lib, o)] = out[2 * i]
    libc_syms = []
    if args.libc:
        out = subprocess.run(['nm', '-D', '--defined-only', args.libc], capture_output=True,
                             text=True).stdout
        for line in out.split('\n'):
            p = line.split()
            if len(p) == 3 and p[1] in 'TtWi':
                libc_syms.append((int(p[0], 16), p[2].split('@')[0]))
        libc_syms.sort()
    libc_addrs = [a for a, _ in libc_syms]

    def name(frame):
        lib, off = frame
        if frame in names:
            return names[frame][:120]
        if libc_syms and lib.startswith('libc.so'):
            i = bisect.bisect_right(libc_addrs, vaddr(args.libc, off)) - 1
            return 'libc:' + (libc_syms[i][1] if i >= 0 else '?')
        return lib

    per_thread = collections.Counter(tid for tid, _ in stacks)
    print(f'{len(stacks)} samples; per thread: {per_thread.most_common(8)}')
    for tid, count in per_thread.most_common(3):
        leaf, incl = collections.Counter(), collections.Counter()
        for t, frames in stacks:
            if t != tid or not frames:
                continue
            leaf[name(frames[0])] += 1
            for n in {name(f) for f in frames}:
                incl[n] += 1
        print(f'\n== thread {tid}: {count} samples')
        for n, c in leaf.most_common(args.top // 2):
            print(f'  leaf {100 * c / count:5.1f}%  {n}')
        for n, c in incl.most_common(args.top):
            print(f'  incl {100 * c / count:5.1f}%  {n}')
        if args.callers:
            pattern = re.compile(args.callers)
            via = collections.Counter()
            for t, frames in stacks:
                if t != tid:
                    continue
                hit = next((k for k, f in enumerate(frames) if pattern.search(name(f))), None)
                if hit is None:
                    continue
                ours = next((f for f in frames[hit + 1:] if f in names), None)
                via[name(ours) if ours else '(none of ours)'] += 1
            for n, c in via.most_common(args.top // 2):
                print(f'  via  {100 * c / count:5.1f}%  {n}  (reached {args.callers})')


if __name__ == '__main__':
    main()
