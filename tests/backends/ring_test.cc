// The ring backend (TCP between hosts, shared memory between the processes of one host) in the
// multi-process conformance suite, on one host and on several (network namespaces). Its failure
// paths are in tests/multiprocess/fault_test.cc.
#include "tests/multiprocess/conformance.h"

// What the suite expects ring to run, rather than what ring says it runs.
TEST(RingCapabilities, EveryCollectiveOpAndDtypeOnCpu) {
  tributary::testing::expect_every_cpu_capability("ring");
}

// Every process here is on one host: "ring" goes through shared memory, intra_host=net through TCP.
TRIBUTARY_MULTIPROCESS_CONFORMANCE(Ring, "ring");
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingShmSmallChunks, "ring:shm_chunk_bytes=4KiB");
// Every all-reduce over 16 KiB reads the peers' buffers (auto does so only from 2 MiB, larger than
// the suite's), in blocks of 4 KiB: many blocks per piece, and short last pieces.
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingShmSingleCopy, "ring:shm_single_copy=on,shm_chunk_bytes=4KiB");
// Buffers from Buffer::allocate_shareable, every all-reduce's outputs registered: the direct path
// (each rank reduces its piece from every rank's buffer and writes it into all), in blocks of 4 KiB.
TRIBUTARY_MULTIPROCESS_CONFORMANCE_SHAREABLE(RingShmDirect, "ring:shm_chunk_bytes=4KiB");
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingNet, "ring:intra_host=net");
// Every segment of 64 KiB or more sent from the caller's pages (zero_copy=auto, the default, does
// so only from 2 MiB messages, larger than the suite's).
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingNetZeroCopy, "ring:intra_host=net,zero_copy=on");
// Small segments and slices: a 65537-element all-reduce runs as several slices of several segments.
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingForcedRing,
                                   "ring:intra_host=net,algorithm=ring,segment_bytes=4KiB,"
                                   "slice_bytes=16KiB");
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingHalvingDoubling,
                                   "ring:intra_host=net,algorithm=halving_doubling");
// Striped and authenticated: every frame of every stripe carries a MAC.
TRIBUTARY_MULTIPROCESS_CONFORMANCE(RingThreeSocketsAuthenticated,
                                   "ring:intra_host=net,sockets_per_peer=3,"
                                   "authenticate_frames=true");

// Several hosts: hierarchical by default where a host runs several processes (shared memory inside
// a host, TCP between hosts), flat where it is forced off or each host runs one.
TRIBUTARY_MULTIHOST_CONFORMANCE(Ring, HostsParam{"ring:algorithm=auto", 2, 2, 1},
                                HostsParam{"ring:algorithm=auto", 2, 2, 2},
                                HostsParam{"ring:intra_host=net", 2, 2, 1},
                                HostsParam{"ring:algorithm=ring", 3, 2, 1},
                                HostsParam{"ring:hierarchy=off", 2, 2, 1},
                                HostsParam{"ring:algorithm=auto", 2, 1, 1});

// A rank killed on another "host", flat and hierarchical.
TRIBUTARY_MULTIHOST_FAULTS(Ring, "ring", "ring:hierarchy=off");
