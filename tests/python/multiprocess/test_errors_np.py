# Failures across processes: a rank that refuses its part (bad input on one rank only) fails its
# peers at once, with the cause, instead of at their timeout; a rendezvous that nobody joins is a
# timeout with a code.
import os
import time

import numpy as np
import pytest

import tributary

RANK = int(os.environ.get("TRIBUTARY_RANK", "0"))


def test_bad_input_on_one_rank_fails_every_rank():
    ops = tributary.backend("ring:timeout=60s", devices=1)
    good = np.ones(8, np.float32)
    start = time.monotonic()
    with pytest.raises(tributary.Error) as e:
        if RANK == 1:
            ops.all_reduce([good, good])  # two buffers for one replica: refused on rank 1 only
        else:
            ops.all_reduce(good)
    elapsed = time.monotonic() - start
    if RANK == 1:
        assert e.value.code == tributary.StatusCode.INVALID_ARGUMENT
    else:
        assert e.value.code != tributary.StatusCode.OK
        assert elapsed < 50, f"rank {RANK} waited {elapsed:.0f}s: the peer's refusal did not reach it"
    ops.close()
