"""One rank of the rendezvous tests: `python rendezvous_rank.py PORT RANK WORLD TIMEOUT_S REPORT_S ROUNDS HOLD_S`.

Rendezvouses through `lightning_mccl.rendezvous` (hosts from MCCL_HOSTS), then proves the store is shared:
sets its own key and reads every other rank's. Prints "arrived rank R saw [...]" and exits 0; on a
RendezvousError prints "RendezvousError: ..." and exits 3. It does so ROUNDS times, as a
process making one group after another; rank 0 keeps each round's store HOLD_S seconds after the round
(a destroyed group's store still open)."""
import sys
import time
from datetime import timedelta

from lightning_mccl.rendezvous import RendezvousError, rendezvous


def main(port, rank, world, timeout_s, report_s, rounds, hold_s):
    print(f"rank {rank} starting", flush=True)
    for _ in range(rounds):
        one_round(port, rank, world, timeout_s, report_s, hold_s)


def one_round(port, rank, world, timeout_s, report_s, hold_s):
    try:
        store = rendezvous("127.0.0.1", port, rank, world, timedelta(seconds=timeout_s), report_s=report_s)
    except RendezvousError as e:
        print(f"RendezvousError: {e}", flush=True)
        sys.exit(3)
    store.set(f"test/{rank}", str(rank * 10))
    seen = [store.get(f"test/{r}").decode() for r in range(world)]
    store.set(f"done/{rank}", "1")
    store.wait([f"done/{r}" for r in range(world)])
    # Rank 0's store must outlive every other rank's wait above (its answer in flight), so rank 0 leaves last:
    # each other rank says it is through, with a set, which needs no answer.
    if rank == 0:
        store.wait([f"through/{r}" for r in range(1, world)])
    else:
        store.set(f"through/{rank}", "1")
    print(f"arrived rank {rank} saw {seen}", flush=True)
    if rank == 0:
        time.sleep(hold_s)


if __name__ == "__main__":
    a = sys.argv[1:]
    main(int(a[0]), int(a[1]), int(a[2]), float(a[3]), float(a[4]), int(a[5]), float(a[6]))
